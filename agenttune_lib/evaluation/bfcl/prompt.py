"""BFCL's default prompting system prompt, assembled from the templates the bfcl-eval package ships."""
from __future__ import annotations

import copy
import json
from typing import Any

__all__ = ["bfcl_system_prompt", "bfcl_system_prompt_template"]


def bfcl_system_prompt_template() -> str:
    """BFCL's default system prompt (python return format, no tag, JSON docs, plaintext, classic) with ``{functions}`` unfilled."""
    from bfcl_eval.constants import default_prompts as dp  # pure module: no provider SDK imports

    style = dp.PROMPT_STYLE_TEMPLATES["classic"]
    tool_call_format = style["tool_call_no_tag"].format(
        output_format=dp.OUTPUT_FORMAT_MAPPING["python"], param_types=dp.PARAM_TYPE_MAPPING["python"]
    )
    return dp.PROMPT_TEMPLATE_MAPPING["plaintext"].format(
        persona=style["persona"],
        task=style["task"],
        tool_call_format=tool_call_format,
        multiturn_behavior=style["multiturn_behavior"],
        available_tools=style["available_tools"].format(format="json", functions="{functions}"),
    )


def _with_python_hint(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(functions)
    for func in out:
        func["description"] = func.get("description", "") + " Note that the provided function is in Python 3 syntax."
    return out


def bfcl_system_prompt(functions: list[dict[str, Any]], template: str | None = None) -> str:
    """The system prompt for one entry: the template with the entry's functions as indented JSON."""
    template = template or bfcl_system_prompt_template()
    return template.replace("{functions}", json.dumps(_with_python_hint(functions), indent=4))
