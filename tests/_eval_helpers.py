"""Test helpers for the evaluation area: BFCL's own AST checker loaded without its provider SDK imports."""
from __future__ import annotations

import importlib
import sys
import types


def load_bfcl_reference_checker():
    """BFCL's ``ast_checker`` module, with ``constants.model_config`` (which imports every provider SDK) replaced.

    The checker only reads ``MODEL_CONFIG_MAPPING[name].underscore_to_dot``; a local open-weight
    prompting model keeps dots, so the replacement maps every name to ``underscore_to_dot=False``.
    Returns None when bfcl-eval is not installed.
    """
    try:
        importlib.import_module("bfcl_eval.constants.enums")
    except ModuleNotFoundError:
        return None
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules or not getattr(sys.modules[name], "_agenttune_test_stub", False):
        stub = types.ModuleType(name)
        stub._agenttune_test_stub = True

        class _Config:
            underscore_to_dot = False

        class _Mapping(dict):
            def __missing__(self, key):
                return _Config()

        stub.MODEL_CONFIG_MAPPING = _Mapping()
        sys.modules[name] = stub
        sys.modules.pop("bfcl_eval.eval_checker.ast_eval.ast_checker", None)
    return importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")


def reference_verdict(module, entry, decoded) -> bool:
    """BFCL's own verdict for decoded calls on an AST entry."""
    from bfcl_eval.constants.enums import Language

    result = module.ast_checker(entry.functions, decoded, entry.ground_truth, Language.PYTHON, entry.category, "local-model")
    return bool(result["valid"])
