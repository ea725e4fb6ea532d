"""Software-defined assets, one module per lifecycle group."""
