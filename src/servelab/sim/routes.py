"""HTTP paths → handlers of the simulated server.

Common to every personality: the OpenAI routes (`/v1/completions`, `/v1/chat/completions`,
`/v1/models`), `/health`, `/metrics` (the personality's metric names) and the simulator's own
`/servelab/gpus` (telemetry), `/servelab/state` (scheduler counters) and `/servelab/info` (what the
simulated server is: personality, model, host, layout, clock). A personality adds the engine's info
routes by naming a handler of `ENGINE_HANDLERS` per path (personalities.toml [routes]).
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from servelab.jsontypes import JsonObject, JsonValue
from servelab.sim.http import HttpError, HttpProtocol, Request
from servelab.sim.personalities import ROUTE_HANDLERS
from servelab.sim.render import render_metrics
from servelab.sim.state import SimState
from servelab.sim.telemetry import gpus

Handler = Callable[[SimState, HttpProtocol, Request], None]
GENERATE = {"/v1/completions": False, "/v1/chat/completions": True}  # path -> chat
METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def _json(proto: HttpProtocol, req: Request, body: JsonValue) -> None:
    proto.send(200, orjson.dumps(body), keep_alive=req.keep_alive)


# -- what the server reports ---------------------------------------------------------------------


def layout(srv: SimState) -> JsonObject:
    lay = srv.cfg.setup.layout
    return {"tp": lay.tp, "pp": lay.pp, "ep": lay.ep, "dp": lay.dp}


def state(srv: SimState) -> JsonObject:
    """The scheduler's counters and the effective settings (GET /servelab/state)."""
    c = srv.sched.counters
    lay = layout(srv)
    return {
        "ready": srv.ready,
        "dead": srv.dead,
        "personality": srv.persona.name,
        "model_time_s": srv.model_now(),
        "speed": srv.cfg.speed,
        "steps": c.steps,
        "busy_s": c.busy_s,
        "preemptions": c.preemptions,
        "requests": c.requests,
        "running": srv.sched.num_running,
        "waiting": srv.sched.num_waiting,
        "kv_cache_tokens": srv.kv_tokens,
        "kv_usage": srv.sched.kv_usage,
        "allreduce_collapse": srv.collapse,
        "effective": {
            **srv.eff.as_json(),
            "tp": lay["tp"],
            "pp": lay["pp"],
            "dp": lay["dp"],
            "ep": lay["ep"],
            "moe_runner_backend": srv.cfg.engine.moe_runner_backend,
        },
    }


def info(srv: SimState) -> JsonObject:
    """What the simulated server is (GET /servelab/info): a benchmark records it with every run."""
    cfg, s = srv.cfg, srv.cfg.setup
    return {
        "engine": "sim",
        "personality": srv.persona.name,
        "engine_version": srv.persona.version,
        "model": cfg.model_name or cfg.engine.model,
        "served_model_name": srv.served,
        "host": {
            "gpu": s.host.gpu.name,
            "gpu_description": s.host.gpu.description,
            "num_gpus": len(srv.gpu_mem_mib),
            "interconnect": s.host.interconnect.name,
        },
        "layout": layout(srv),
        "clock": {"speed": cfg.speed, "model_time_s": srv.model_now()},
        "ready": srv.ready,
        "dead": srv.dead,
        "effective": state(srv)["effective"],
    }


def server_info(srv: SimState) -> JsonObject:
    """SGLang's /get_server_info: its server arguments, effective, plus live internal state."""
    a = srv.cfg.engine
    out = dict(a.raw)
    out.update(
        {
            "model_path": a.model,
            "served_model_name": a.served_model_name,
            "host": srv.cfg.host,
            "port": srv.cfg.port,
            "tp_size": a.tp,
            "pp_size": a.pp,
            "dp_size": a.dp,
            "ep_size": a.ep,
            "moe_runner_backend": a.moe_runner_backend,
            "disable_radix_cache": not a.prefix_caching,
            "mem_fraction_static": srv.eff.mem_fraction,
            "chunked_prefill_size": srv.eff.max_batched_tokens,
            "max_running_requests": srv.eff.max_running,
            "enable_flashinfer_allreduce_fusion": a.allreduce_fusion,
            "max_total_num_tokens": srv.kv_tokens,
            "version": srv.persona.version,
            "internal_states": [{"last_gen_throughput": srv.gen_throughput, "avg_spec_accept_length": None}],
        }
    )
    return out


def models(srv: SimState) -> JsonObject:
    return {
        "object": "list",
        "data": [
            {
                "id": srv.served,
                "object": "model",
                "created": srv.created,
                "owned_by": srv.persona.owned_by,
                "root": srv.cfg.engine.model,
                "parent": None,
                "max_model_len": srv.eff.max_model_len,
            }
        ],
    }


# -- handlers ----------------------------------------------------------------------------------------


def _health(srv: SimState, proto: HttpProtocol, req: Request) -> None:
    ok = srv.ready and not srv.dead
    proto.send(200 if ok else 503, b"" if ok else b'{"detail":"not ready"}', keep_alive=req.keep_alive)


def _metrics(srv: SimState, proto: HttpProtocol, req: Request) -> None:
    if "no_metrics" in srv.cfg.faults:
        proto.send(404, b'{"detail":"Not Found"}', keep_alive=req.keep_alive)
        return
    body = render_metrics(srv.persona, srv.served, srv.metric_values())
    proto.send(200, body, keep_alive=req.keep_alive, content_type=METRICS_TYPE)


def _model_info(srv: SimState, proto: HttpProtocol, req: Request) -> None:
    model = srv.cfg.engine.model
    _json(proto, req, {"model_path": model, "tokenizer_path": model, "is_generation": True})


COMMON: dict[str, Handler] = {
    "/health": _health,
    "/servelab/gpus": lambda srv, proto, req: _json(proto, req, gpus(srv)),
    "/servelab/state": lambda srv, proto, req: _json(proto, req, state(srv)),
    "/servelab/info": lambda srv, proto, req: _json(proto, req, info(srv)),
    "/metrics": _metrics,
    "/v1/models": lambda srv, proto, req: _json(proto, req, models(srv)),
}

# The handlers a personality's [routes] table may name.
ENGINE_HANDLERS: dict[str, Handler] = {
    "version": lambda srv, proto, req: _json(proto, req, {"version": srv.persona.version}),
    "server_info": lambda srv, proto, req: _json(proto, req, server_info(srv)),
    "model_info": _model_info,
}
if set(ENGINE_HANDLERS) != set(ROUTE_HANDLERS):  # the loader validates [routes] against ROUTE_HANDLERS
    raise RuntimeError("sim.routes.ENGINE_HANDLERS and sim.personalities.ROUTE_HANDLERS disagree")


class Router:
    """Dispatches one request: generation to the server, everything else to its handler."""

    def __init__(self, srv: SimState) -> None:
        self.srv = srv
        self.table: dict[str, Handler] = dict(COMMON)
        for path, name in srv.persona.routes.items():
            self.table[path] = ENGINE_HANDLERS[name]

    async def handle(self, proto: HttpProtocol, req: Request) -> bool:
        srv = self.srv
        if "hang" in srv.cfg.faults:
            await proto.closed_fut
            return False
        path = req.path
        key = srv.cfg.api_key
        if key and path.startswith("/v1") and req.headers.get("authorization") != f"Bearer {key}":
            raise HttpError(401, "Unauthorized", body=orjson.dumps({"error": "Unauthorized"}))
        chat = GENERATE.get(path)
        if chat is not None:
            if req.method != "POST":
                raise HttpError(405, "Method Not Allowed")
            return await srv.generate(proto, req, chat=chat)
        handler = self.table.get(path)
        if handler is None:
            raise HttpError(404, "Not Found")
        handler(srv, proto, req)
        return True
