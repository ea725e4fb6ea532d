"""The ``agenttune`` command: a thin Typer shell over the library."""
from __future__ import annotations

import typer

app = typer.Typer(name="agenttune", help="AgentTune Platform: train, evaluate and audit tool-using LLM agents.", no_args_is_help=True)


@app.command()
def version() -> None:
    """Print the installed AgentTune version."""
    from agenttune_lib import __version__

    typer.echo(__version__)


# Sub-command groups register here, one line each.
from agenttune_lib.cli import decide as _decide; app.add_typer(_decide.app, name="decide")  # noqa: E402
from agenttune_lib.cli import eval as _eval; app.add_typer(_eval.app, name="eval")  # noqa: E402
from agenttune_lib.cli import train as _train; app.add_typer(_train.app, name="train")  # noqa: E402
from agenttune_lib.cli import rag as _rag; app.add_typer(_rag.app, name="rag")  # noqa: E402
from agenttune_lib.cli import spine as _spine; app.add_typer(_spine.app, name="spine")  # noqa: E402
from agenttune_lib.cli import lineage as _lineage; app.command(name="lineage")(_lineage.lineage)  # noqa: E402
from agenttune_lib.cli import multi_agent as _multi_agent; app.add_typer(_multi_agent.app, name="multi-agent")  # noqa: E402
