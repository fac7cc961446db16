"""`modelforge admin nodes credential …`: a node's credential revoked, or rotated (and
installed in the agent's state dir in the same step, when run on the node)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.admin.answers import answer
from cli.admin.client import AdminFailure
from cli.admin.context import FormatOption, JsonOption, NodeArg, output
from cli.admin.help import group
from schemas.admin import CredentialRevoked, CredentialRotated
from schemas.protocol import NODES

app = group("A node's credential: revoke it, or rotate it.")


@app.command("revoke")
def revoke_credential(
    ctx: typer.Context, node: NodeArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """Revoke the node's credentials: it is refused until it is given a new one."""
    out = output(json, fmt)
    revoked = answer(ctx, lambda c: c.post(CredentialRevoked, f"{NODES}/{node}/credential/revoke"))
    if out.json_mode:
        out.json(revoked)
    else:
        out.line(f"revoked {len(revoked.revoked_credential_ids)} credential(s)")


@app.command("rotate")
def rotate_credential(
    ctx: typer.Context,
    node: NodeArg,
    state_dir: Annotated[
        Path | None,
        typer.Option(help="the agent's state dir: install the new credential there at once"),
    ] = None,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Issue a new credential to the node; the old ones are revoked.

    With --state-dir (run on the node), it is installed in the agent's state in the
    same step; otherwise it is shown once, for `modelforge agent install-credential`."""
    from agent.errors import AgentError
    from agent.state import StateDir

    out = output(json, fmt)
    state = StateDir(state_dir) if state_dir is not None else None
    if state is not None:
        # Checked before rotating: a credential rotated for the wrong state dir would
        # revoke the node's working one and have nowhere to go.
        try:
            identity = state.load_identity()
        except (AgentError, OSError) as exc:
            raise AdminFailure(f"{state_dir}: {exc}") from None
        if identity is None or identity.node_id != node:
            held = "no identity" if identity is None else f"node {identity.node_id}"
            raise AdminFailure(f"{state_dir} holds {held}, not node {node}; nothing was rotated")
    rotated = answer(ctx, lambda c: c.post(CredentialRotated, f"{NODES}/{node}/credential/rotate"))
    if state is None:
        if out.json_mode:
            out.json(rotated)
        else:
            out.line(
                f"credential {rotated.credential_id} (shown once; install it on the node "
                "with `modelforge agent install-credential`):"
            )
            out.secret(rotated.credential)
        return
    try:
        installed = state.install_credential(rotated.model_dump_json())
    except (AgentError, OSError) as exc:
        # The new credential exists only here now: never lose it.
        out.error(f"installing failed ({exc}); the credential, shown once:")
        out.secret(rotated.model_dump_json())
        raise AdminFailure("the credential was rotated but not installed") from None
    out.note(
        f"installed credential {installed.credential_id} for node {installed.node_id} in "
        f"{state_dir}; a running agent picks it up when its old one is refused"
    )
    if out.json_mode:
        # The secret stays in the state dir: only its id is printed.
        out.json(
            CredentialRevoked(node_id=node, revoked_credential_ids=rotated.revoked_credential_ids)
        )
