"""``laggard remediate``'s flags: argparse only, so ``--help`` and a bad flag start at once.

The run module (:mod:`laggard.actions.remediate`) is imported after the flags parsed
(``laggard/cli.py``; ``tests/test_cli_startup.py``).
"""

from __future__ import annotations

import argparse

#: Where the webhook receiver listens by default (beside the agent's 9477).
DEFAULT_LISTEN_ADDRESS = "127.0.0.1:9479"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the flags of ``laggard remediate``."""
    parser.epilog = (
        "Point an Alertmanager webhook_config at http://HOST:PORT/alerts. Dry run unless "
        "--act: every decision is one 'audit ...' line on stderr (and --audit-log) saying "
        "what was done or would have been.")
    parser.add_argument("--web.listen-address", dest="listen_address",
                        default=DEFAULT_LISTEN_ADDRESS, metavar="HOST:PORT",
                        help="where Alertmanager's webhook reaches this receiver (default "
                             "%(default)s; port 0: any free port, printed at start)")
    parser.add_argument("--web.bearer-token-file", dest="bearer_token_file", default=None,
                        metavar="PATH",
                        help="accept a webhook only with 'Authorization: Bearer <the file's "
                             "content>' (Alertmanager's webhook_config http_config."
                             "authorization); without it anyone who reaches the port can ask "
                             "for a drain")
    parser.add_argument("--action", choices=("slurm", "kubernetes", "exclude-file"),
                        default="slurm",
                        help="what is done to a node: drain it through scontrol, cordon and "
                             "taint it through the Kubernetes API, or list it in a file of "
                             "excluded hosts for the next launch (default %(default)s)")
    parser.add_argument("--act", action="store_true",
                        help="really act (default: dry run, the audit line says what would run)")
    parser.add_argument("--prometheus-url", default=None, metavar="URL",
                        help="Prometheus scraping the agents: maps an alert to its node "
                             "(laggard_agent_info, laggard_rank_info) and a node to its jobs")
    guards = parser.add_argument_group("guards")
    guards.add_argument("--max-nodes-per-hour", type=int, default=2, metavar="N",
                        help="most nodes taken out in any sliding hour (default %(default)s)")
    guards.add_argument("--max-job-percent", type=float, default=10.0, metavar="P",
                        help="most of one job's nodes held at once, in percent, at least one "
                             "node (default %(default)s; 100 turns the check off)")
    guards.add_argument("--act-on-warning", action="store_true",
                        help="act on warning-level alerts (LaggardStragglerRank) too; by "
                             "default only critical ones act")
    parser.add_argument("--audit-log", default=None, metavar="PATH",
                        help="also append every audit line to this file")
    slurm = parser.add_argument_group("--action slurm")
    slurm.add_argument("--scontrol", default="scontrol", metavar="PATH",
                       help="the scontrol program (default %(default)s)")
    exclude = parser.add_argument_group("--action exclude-file")
    exclude.add_argument("--exclude-file", default=None, metavar="PATH",
                         help="the file of excluded hosts, one per line (srun "
                              "--exclude=PATH reads it)")
    exclude.add_argument("--hosts", default=None, metavar="PATH",
                         help="a hostfile of every host (one per line, optional fields after "
                              "the name); with --hostfile, written again minus excluded hosts")
    exclude.add_argument("--hostfile", default=None, metavar="PATH",
                         help="where the filtered hostfile goes (for a torchrun launcher)")
