"""Model backends: the OpenAI-compatible adapter over plain HTTP, and the local transformers model."""
import pytest
from _chat_stub import chat_endpoint

from agenttune_lib.decide import GraphRunner, ModelRequest, OpenAICompatibleModel, TransformersModel, build_model

# Audit keys, head checkpoints and artifacts go to a per-test $AGENTTUNE_HOME.
pytestmark = pytest.mark.usefixtures("platform_home")


def _reply(body):
    if body["model"] == "broken":
        return 500, b"overloaded"
    prompt = body["messages"][-1]["content"]
    reply = '{"sentiment": "negative", "intensity": 0.9, "mentions_cancellation": true}' if "cancel" in prompt else "?"
    return {"choices": [{"message": {"role": "assistant", "content": reply}}]}


class _Handler:
    requests: list = []


@pytest.fixture
def endpoint():
    with chat_endpoint(_reply) as (url, seen):
        _Handler.requests = seen
        yield url


def test_openai_compatible_endpoint_drives_a_template(endpoint, tmp_path):
    model = build_model("openai", endpoint=endpoint + "/v1", model_name="served-model", api_key="k-123", max_new_tokens=32)
    state = GraphRunner.from_template("sentiment", model=model, audit=tmp_path / "a.jsonl", destinations=[]).run({"text": "I will cancel"})
    assert state.verdict["label"] == "negative_escalate"
    req = _Handler.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer k-123"
    assert req["body"]["model"] == "served-model" and req["body"]["max_tokens"] == 32
    assert [m["role"] for m in req["body"]["messages"]] == ["system", "user"]


def test_endpoint_errors_are_stage_failures_with_the_cause(endpoint, tmp_path):
    model = OpenAICompatibleModel(endpoint, "broken")
    state = GraphRunner.from_template("sentiment", model=model, audit=None, destinations=[]).run({"text": "x"})
    assert state.verdict["label"] == "unknown" and "HTTP 500" in state.step_history[0]["error"] and "overloaded" in state.step_history[0]["error"]
    with pytest.raises(RuntimeError, match="unreachable"):
        OpenAICompatibleModel("http://127.0.0.1:1", "m", timeout=2).generate(ModelRequest("hi"))


def test_transformers_model_generates_from_a_checkpoint(tmp_path):
    from agenttune_lib.models.tiny import save_tiny_model

    path = save_tiny_model(tmp_path / "tiny")
    model = TransformersModel(path, max_new_tokens=5)
    out = model.generate(ModelRequest("Say hi", system="be brief"))
    assert isinstance(out, str)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TransformersModel(tmp_path / "missing").generate(ModelRequest("x"))
    with pytest.raises(ValueError, match="unknown model backend"):
        build_model("carrier-pigeon")


def test_transformers_model_runs_each_call_on_its_own_thread_count_and_restores_the_process_setting(tmp_path, monkeypatch):
    """DECIDE's short calls run on one intra-op thread by default; the process's own setting comes back after each call."""
    import torch

    from agenttune_lib.models.tiny import save_tiny_model

    path = save_tiny_model(tmp_path / "tiny")
    seen: list[int] = []
    real_generate = None

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real_generate(*args, **kwargs)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for threads, expected in ((1, 1), (None, 2), (2, 2)):
            model = TransformersModel(path, max_new_tokens=3, num_threads=threads)
            model._load()
            real_generate = model.model.generate
            monkeypatch.setattr(model.model, "generate", spy)
            model.generate(ModelRequest("Say hi"))
            assert seen[-1] == expected and torch.get_num_threads() == 2
        assert TransformersModel(path).num_threads == 1 and build_model("transformers", checkpoint=path).num_threads == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="num_threads must be at least 1"):
        TransformersModel(path, num_threads=0)
