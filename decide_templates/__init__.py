"""The bundled DECIDE templates (YAML package data); see ``agenttune_lib.decide.TemplateRegistry``."""
