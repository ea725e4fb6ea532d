"""PII redaction for everything that leaves a DECIDE run: Presidio detectors plus format-insensitive listed values."""
from agenttune_lib.privacy.pii import PIIDetector, default_detector
from agenttune_lib.privacy.values import value_patterns

__all__ = ["PIIDetector", "default_detector", "value_patterns"]
