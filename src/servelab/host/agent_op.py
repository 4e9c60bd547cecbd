"""An agent operation as one typed contract both halves read: its name, its request (a pydantic model whose
fields are the operation's JSON arguments) and its answer (a type pydantic validates). The control side
calls it in one line, `POLL.call(host, PollRequest(marker=m, offset=o))`, and reads attributes; the agent
serves it with `POLL.serve(op_poll)`, a function of (state, request) returning the answer.

Each contract is declared in the room below the agent that its caller already imports (host/ for this
machine's processes, files, ports and logs; lifecycle/, deploy/, bench/ for theirs), so neither half
imports the other. The wire stays plain JSON: the same operation names and argument keys as before the
types (`model_dump(mode="json")`), so an agent of either age answers the same lines."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter

if TYPE_CHECKING:
    from servelab.host.transport import Host

Req = TypeVar("Req", bound="Request")
Ans = TypeVar("Ans")


class Request(BaseModel):
    """An operation's arguments: an unknown key is refused, as a Python call refuses an unknown keyword."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Answer(BaseModel):
    """An operation's answer: a key a newer agent adds is ignored by an older control side."""

    model_config = ConfigDict(extra="ignore")


class NoArgs(Request):
    """The request of an operation without arguments."""


class AgentOp(Generic[Req, Ans]):
    """One operation: `call` on the control side, `serve` on the agent's."""

    def __init__(
        self, name: str, request: type[Req], answer: TypeAdapter[Ans], *, exclude_unset: bool = False
    ) -> None:
        self.name = name
        self.request = request
        self.answer = answer
        self.exclude_unset = exclude_unset  # the answer's keys exactly as the agent set them (no defaults)

    def call(self, host: Host, req: Req, *, timeout: float | None = None) -> Ans:
        """Run it on `host` (its agent, or in-process on this machine); the answer validated. `timeout`:
        an SshHost's deadline for the answer (its default otherwise)."""
        args = req.model_dump(mode="json", by_alias=True)
        if timeout is not None:
            args["_timeout"] = timeout
        return self.answer.validate_python(host.call(self.name, **args))

    def serve(self, fn: Callable[[Any, Req], Ans]) -> Callable[..., Any]:
        """The agent's table entry: the arguments validated into the request, the answer into JSON."""

        def op(state: Any, **args: Any) -> Any:
            answer = fn(state, self.request.model_validate(args))
            return self.answer.dump_python(
                answer, mode="json", by_alias=True, exclude_unset=self.exclude_unset
            )

        op.__name__ = op.__qualname__ = getattr(fn, "__name__", self.name)
        op.__doc__ = fn.__doc__
        return op

    def entry(self, fn: Callable[[Any, Req], Ans]) -> tuple[str, Callable[..., Any]]:
        """`(name, serve(fn))`: a line of an agent group's `OPS`, its name spelled once."""
        return self.name, self.serve(fn)
