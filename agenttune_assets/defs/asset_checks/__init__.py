"""Asset checks, one module per lifecycle group."""
