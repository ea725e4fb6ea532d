"""The FastAPI app: ``POST /v1/chat/completions`` (tools, streaming, structured tool calls), ``GET /v1/models``,
``POST /v1/feedback`` and the operator page; every reply names the adapter that produced it."""
from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agenttune_lib.service.config import ServiceConfig
from agenttune_lib.service.engine import Completion, GenJob, build_engine
from agenttune_lib.service.errors import APIError, error_body
from agenttune_lib.service.http import ApiKeyAuth, BodyLimit
from agenttune_lib.service.registry import ModelRegistry
from agenttune_lib.service.schemas import ChatCompletionRequest, FeedbackRequest
from agenttune_lib.service.tools import ToolPlan, parse_reply, plan_tools, render_messages
from agenttune_lib.service.traffic import TrafficRecord, TrafficRecorder, record_feedback

__all__ = ["create_app", "ServiceState", "ADAPTER_HEADER"]

#: The response header naming the adapter that produced the reply (also in ``model`` and ``system_fingerprint``).
ADAPTER_HEADER = "X-AgentTune-Adapter"


@dataclasses.dataclass
class ServiceState:
    """What the app holds for its lifetime: settings, the registry, the engine, the traffic recorder."""

    config: ServiceConfig
    registry: ModelRegistry
    engine: Any
    recorder: TrafficRecorder
    warehouse: Any
    started_at: float = dataclasses.field(default_factory=time.time)


def _fmt_validation(exc: RequestValidationError) -> tuple[str, str | None]:
    errs = exc.errors()
    if not errs:
        return "invalid request body", None
    first = errs[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return f"request body is not valid JSON: {first.get('msg')}", None
    param = ".".join(loc) or None
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{param or 'body'}: {first.get('msg')}{more}", param


def _max_tokens(req: ChatCompletionRequest, cfg: ServiceConfig) -> int:
    asked = req.max_completion_tokens or req.max_tokens
    if asked is not None and asked > cfg.max_completion_tokens:
        raise APIError(400, f"max_tokens={asked} exceeds this service's limit of {cfg.max_completion_tokens}", "max_tokens_exceeded", "max_tokens")
    return asked or cfg.default_max_tokens


def _json_constraint(req: ChatCompletionRequest) -> dict[str, Any] | None:
    fmt = req.response_format
    if not fmt or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "object"}
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise APIError(400, "response_format.json_schema.schema must be a JSON schema object", "invalid_response_format", "response_format")
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise APIError(400, f"response_format schema is not a valid JSON schema: {exc.message}", "invalid_response_format", "response_format") from None
        return schema
    raise APIError(400, f"response_format type {fmt.get('type')!r} is not served (text, json_object, json_schema)", "invalid_response_format", "response_format")


def _stops(req: ChatCompletionRequest) -> tuple[str, ...]:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > 4 or any(not s for s in stops):
        raise APIError(400, "stop takes up to 4 non-empty strings", "invalid_stop", "stop")
    return tuple(stops)


def create_app(config: ServiceConfig, warehouse: Any = None, redact: Any = None, review_runner_for: Any = None) -> FastAPI:
    """The service app; ``redact`` (text -> text) defaults to the privacy layer's Presidio detector when ``config.redact``;
    ``review_runner_for(template_id)`` gives the GraphRunner that resumes a reviewed run (default: over the deployed model)."""
    from agenttune_lib.warehouse import Warehouse

    wh = warehouse if warehouse is not None else Warehouse(config.warehouse_path)
    registry = ModelRegistry(config.base_path, config.deploy_root, wh)
    if redact is None and config.redact:
        from agenttune_lib.privacy import default_detector

        redact = default_detector().redact

    def tokenizer_for(base: str) -> Any:
        from agenttune_lib.models.serving import ServedModel

        return ServedModel(config.base_path, None, None).load()[1]

    engine = build_engine(config.engine, config.max_batch, config.batch_wait_s, config.num_threads)
    recorder = TrafficRecorder(wh, redact, tokenizer_for, config.flush_every_s)
    state = ServiceState(config, registry, engine, recorder, wh)

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await run_in_threadpool(recorder.close)
        await run_in_threadpool(engine.close)

    app = FastAPI(title="AgentTune service", version="0.1.0", lifespan=lifespan)
    app.state.service = state

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.code, exc.param, exc.type), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _fmt_validation(exc)
        return JSONResponse(error_body(message, "invalid_request", param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(error_body(f"{request.method} {request.url.path}: {exc.detail}", code), status_code=exc.status_code)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        served = registry.deployed()
        return {"status": "ok", "served_adapter_id": served.served_adapter_id, "auth": config.auth_enabled,
                "traffic_written": recorder.written}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": await run_in_threadpool(registry.list_models)}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest):
        if len(req.messages) > config.max_messages:
            raise APIError(400, f"{len(req.messages)} messages exceed this service's limit of {config.max_messages}", "too_many_messages", "messages")
        plan = plan_tools(req)
        max_new = _max_tokens(req, config)
        if plan.constrained and not (req.max_completion_tokens or req.max_tokens):
            # A structured call must not be cut by the default budget: room for the longest call its schemas admit.
            from agenttune_lib.models.constrained import schema_token_budget, tool_call_schema

            max_new = min(config.max_completion_tokens, max(max_new, schema_token_budget(tool_call_schema(list(plan.callable))) + 24))
        schema = _json_constraint(req)
        if schema is not None and plan.constrained:
            raise APIError(400, "structured_tool_calls and a JSON response_format cannot both constrain one reply", "invalid_request", "response_format")
        stops = _stops(req)
        served = await run_in_threadpool(registry.resolve, req.model)
        messages = render_messages(req, plan)
        await run_in_threadpool(engine.prompt_ids, served, messages, config.max_prompt_tokens)
        job = GenJob(served, messages, max_new, req.temperature, req.top_p, req.seed, stops,
                     ("</tool_call>",) if plan.callable else (),
                     tool_schemas=tuple(plan.callable) if plan.constrained else None, json_schema=schema,
                     allow_text=plan.allow_text)
        rid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        headers = {ADAPTER_HEADER: served.served_adapter_id, "X-Request-Id": rid}
        t0 = time.perf_counter()
        if req.stream:
            return StreamingResponse(_stream(req, job, plan, rid, created, t0), media_type="text/event-stream", headers=headers)
        comp: Completion = await asyncio.wrap_future(engine.submit(job))
        content, calls = parse_reply(comp.text, plan)
        _record(req, job, plan, comp, calls, rid, time.perf_counter() - t0)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        body = {"id": rid, "object": "chat.completion", "created": created, "model": comp.served_adapter_id,
                "system_fingerprint": f"agenttune:{comp.served_adapter_id}",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else comp.finish_reason, "logprobs": None}],
                "usage": _usage(comp)}
        return JSONResponse(body, headers=headers)

    def _usage(comp: Completion) -> dict[str, int]:
        return {"prompt_tokens": len(comp.prompt_ids), "completion_tokens": len(comp.completion_ids),
                "total_tokens": len(comp.prompt_ids) + len(comp.completion_ids)}

    def _record(req: ChatCompletionRequest, job: GenJob, plan: ToolPlan, comp: Completion, calls: list, rid: str, latency: float) -> None:
        recorder.submit(TrafficRecord(
            request_id=rid, requested_model=req.model, served_adapter_id=comp.served_adapter_id, base_model=str(job.served.base_path),
            decision_id=job.served.decision_id, messages=job.messages, completion_text=comp.text, tool_calls=calls,
            prompt_ids=comp.prompt_ids, completion_ids=comp.completion_ids, logprobs=comp.logprobs, finish_reason=comp.finish_reason,
            latency_s=latency, stream=bool(req.stream), tools=sorted(t["name"] for t in job.tool_schemas or []) or
            sorted((t.function.name for t in req.tools or [])), created_at=dt.datetime.now(dt.timezone.utc).isoformat(), user=req.user,
            tool_specs=[dict(t) for t in plan.callable], structured_tool_calls=plan.constrained, allow_text=plan.allow_text))

    async def _stream(req: ChatCompletionRequest, job: GenJob, plan: ToolPlan, rid: str, created: int, t0: float):
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        if not plan.callable:
            # Plain text streams token by token; a reply that may hold a tool call is sent once it is parsed.
            job.on_text = lambda delta: loop.call_soon_threadsafe(q.put_nowait, ("delta", delta))
        fut = engine.submit(job)
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(q.put_nowait, ("done", None)))
        adapter = job.served.served_adapter_id
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": adapter, "system_fingerprint": f"agenttune:{adapter}"}

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
            return "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}) + "\n\n"

        yield chunk({"role": "assistant", "content": ""})
        while True:
            kind, value = await q.get()
            if kind == "delta":
                yield chunk({"content": value})
                continue
            break
        try:
            comp: Completion = fut.result()
        except Exception as exc:  # noqa: BLE001 - the stream has started: the error is its last event
            yield "data: " + json.dumps(error_body(f"generation failed: {exc}", "generation_failed", type="server_error")) + "\n\n"
            return
        content, calls = parse_reply(comp.text, plan)
        if plan.callable:
            if calls:
                yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
                if content:
                    yield chunk({"content": content})
            elif comp.text:
                yield chunk({"content": comp.text})
        yield chunk({}, "tool_calls" if calls else comp.finish_reason)
        if req.stream_options is not None and req.stream_options.include_usage:
            yield "data: " + json.dumps({**base, "choices": [], "usage": _usage(comp)}) + "\n\n"
        _record(req, job, plan, comp, calls, rid, time.perf_counter() - t0)
        yield "data: [DONE]\n\n"

    @app.post("/v1/feedback")
    async def feedback(fb: FeedbackRequest) -> dict[str, Any]:
        from agenttune_lib.closed_loop.detector import FailureDetector
        from agenttune_lib.service.feedback import served_run

        if fb.reward is None and fb.thumbs is None:
            raise APIError(400, "feedback needs a reward (0..1) or thumbs ('up' or 'down')", "invalid_feedback", "reward")
        reward = fb.reward if fb.reward is not None else (1.0 if fb.thumbs == "up" else 0.0)
        correction = redact(fb.correction) if (redact and fb.correction) else fb.correction
        comment = redact(fb.comment) if (redact and fb.comment) else fb.comment
        await run_in_threadpool(recorder.flush)
        try:
            seq, log = await run_in_threadpool(record_feedback, wh, fb.request_id, reward, fb.thumbs, correction, fb.root_cause, comment)
        except LookupError as exc:
            raise APIError(404, str(exc), "request_not_found", "request_id") from None
        failure = FailureDetector().check(served_run(log))
        return {"object": "feedback", "request_id": fb.request_id, "seq": seq, "reward": reward,
                "served_adapter_id": log.metadata.get("served_adapter_id"),
                "failure": failure is not None, "signals": failure.signals if failure else []}

    from agenttune_lib.service.operator import add_operator_routes

    add_operator_routes(app, state, review_runner_for)
    app.add_middleware(ApiKeyAuth, api_key=config.api_key)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    return app
