"""``dpmarket owner serve OWNER.toml`` and ``dpmarket node serve NODE.toml``: a party's own agent.

An owner or a compute node in another organisation runs its agent on its own machine; the agent
dials out to the market over mutual TLS and answers the market's calls by its own configuration
and policy (actors/remote/). ``dpmarket node fingerprint NODE.toml`` prints the SHA-256 of the
node's X25519 public key (making the key first if absent), which the node hands to the owners
out of band for their ``[nodes]`` pins.

Exit codes: 0 the market finished; 1 gave up waiting for the market (``--give-up``); 2 bad
configuration or an identity refused (by the market, or the market's certificate by the agent);
3 the market stopped short (refused by T-tolerance): start the agent again for its resume.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_agent_parsers"]


def _owner_serve(args: argparse.Namespace) -> int:
    from dpmarket.actors.remote.agentconfig import load_owner_config
    from dpmarket.actors.remote.owneragent import serve_owner

    return serve_owner(load_owner_config(args.config), give_up=args.give_up)


def _node_serve(args: argparse.Namespace) -> int:
    from dpmarket.actors.remote.agentconfig import load_node_config
    from dpmarket.actors.remote.nodeagent import serve_node

    return serve_node(load_node_config(args.config), give_up=args.give_up)


def _node_fingerprint(args: argparse.Namespace) -> int:
    from dpmarket.actors.remote.agentconfig import load_node_config
    from dpmarket.actors.remote.nodeagent import fingerprint_of

    config = load_node_config(args.config)
    print(f'{config.name} = "{fingerprint_of(config)}"')
    return 0


def _serve(sub: Any, role: str, help_: str, serve_help: str, func: Any) -> Any:
    """``dpmarket ROLE serve ROLE.toml [--give-up SECONDS]``; returns ROLE's subparsers."""
    group = sub.add_parser(role, help=help_).add_subparsers(dest=f"{role}_command", required=True)
    serve = group.add_parser(
        "serve",
        help=serve_help,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("config", metavar=f"{role.upper()}.toml", help=f"the {role}'s own config")
    serve.add_argument(
        "--give-up",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="exit 1 after this long without reaching the market (default 600)",
    )
    serve.set_defaults(func=func)
    return group


def add_agent_parsers(sub: Any) -> None:
    _serve(
        sub, "owner", "an owner's own agent (dials out to a market)",
        "take part in a market's purchases from this machine", _owner_serve,
    )  # fmt: skip
    node = _serve(
        sub, "node", "a compute node's own agent (dials out to a market)",
        "be a compute node of a market's secure sums from this machine", _node_serve,
    )  # fmt: skip
    fp = node.add_parser("fingerprint", help="print the node key's fingerprint for owners")
    fp.add_argument("config", metavar="NODE.toml")
    fp.set_defaults(func=_node_fingerprint)
