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


def _serve_args(cmd: Any, what: str) -> None:
    cmd.add_argument("config", metavar=f"{what.upper()}.toml", help=f"the {what}'s own config")
    cmd.add_argument(
        "--give-up",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="exit 1 after this long without reaching the market (default 600)",
    )


def add_agent_parsers(sub: Any) -> None:
    owner = sub.add_parser("owner", help="an owner's own agent (dials out to a market)")
    owner_sub = owner.add_subparsers(dest="owner_command", required=True)
    serve = owner_sub.add_parser(
        "serve",
        help="take part in a market's purchases from this machine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _serve_args(serve, "owner")
    serve.set_defaults(func=_owner_serve)
    node = sub.add_parser("node", help="a compute node's own agent (dials out to a market)")
    node_sub = node.add_subparsers(dest="node_command", required=True)
    serve = node_sub.add_parser(
        "serve",
        help="be a compute node of a market's secure sums from this machine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _serve_args(serve, "node")
    serve.set_defaults(func=_node_serve)
    fp = node_sub.add_parser("fingerprint", help="print the node key's fingerprint for owners")
    fp.add_argument("config", metavar="NODE.toml")
    fp.set_defaults(func=_node_fingerprint)
