"""Deploy: `deploy_preview`, the unit (or Compose/Kubernetes file) a run deploys as; installing only where
the server was started with --allow-install."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from servelab import arguments as A
from servelab.errors import ConfigError
from servelab.mcp import models as M
from servelab.mcp.base import Group, Options, as_tool_errors, call, flags
from servelab.mcp.studies import Studies


def group(opts: Options, runs: Studies) -> Group:
    async def deploy_preview(
        run: A.DeployRun,
        target: A.DeployTarget = "systemd",
        name: A.DeployName = None,
        port: A.DeployPort = None,
        user: A.DeployUser = None,
        env_file: A.EnvFile = None,
        install: Annotated[
            bool, Field(description="Install it (only if the server allows installing).")
        ] = False,
    ) -> M.DeployView:
        """The unit (or Compose/Kubernetes file) a run deploys as, from its exact command line; nothing is
        written or installed unless `install` and the server was started with --allow-install."""
        with as_tool_errors():
            if install and not opts.allow_install:
                raise ConfigError(
                    "install: this server does not install units",
                    hint="start it with `servelab mcp --allow-install` to let an agent install",
                )
        mode = ["--install"] if install else ["--dry-run"]
        return await call(
            M.DeployView,
            [
                "deploy",
                run,
                "--target",
                target,
                *mode,
                *flags(name=name, port=port, user=user, env_file=env_file),
            ],
        )

    return Group([deploy_preview])
