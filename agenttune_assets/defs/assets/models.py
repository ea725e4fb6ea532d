"""[models] base_model: the packaged SmolLM2-135M-Instruct GGUF converted once into a cached checkpoint."""

import dagster as dg

from agenttune_assets.defs.resources import ModelsResource
from agenttune_lib.models.base import DEFAULT_BASE_MODEL, select_base_model


class BaseModelConfig(dg.Config):
    """Which packaged model to convert; ``gguf_path`` points at another GGUF file, ``checkpoint`` at a ready checkpoint.

    The choice is recorded under the models dir, so every downstream default (collect, train,
    evaluate, serving) loads it instead of re-converting the packaged model.
    """

    name: str = DEFAULT_BASE_MODEL
    gguf_path: str = ""
    checkpoint: str = ""
    force: bool = False


@dg.asset(group_name="models", kinds={"pytorch"}, code_version="1")
def base_model(context: dg.AssetExecutionContext, config: BaseModelConfig, models: ModelsResource) -> dg.MaterializeResult:
    """The base checkpoint every model-using asset loads; its data version is the GGUF's content hash."""
    info = select_base_model(
        models.get(), name=config.name, gguf_path=config.gguf_path or None, checkpoint=config.checkpoint or None, force=config.force
    )
    context.log.info(f"base model {info.name}@{info.version} at {info.path} ({'converted' if info.converted else 'cached'})")
    return dg.MaterializeResult(
        metadata={
            "name": info.name,
            "version": info.version,
            "path": dg.MetadataValue.path(str(info.path)),
            "source_gguf": dg.MetadataValue.path(info.source),
            "n_params": dg.MetadataValue.int(int(info.n_params or 0)),
            "converted_now": info.converted,
            "convert_seconds": dg.MetadataValue.float(float(info.seconds)),
        },
        data_version=dg.DataVersion(info.version),
    )
