"""From a finding to an action: ``laggard healthcheck``, ``laggard remediate``, the Slurm drain.

Everything here acts on a node (drains it, cordons it, names it unhealthy) from what the agents
found; every decision is one audit line (:mod:`laggard.actions.audit`) and nothing acts unless
told to (dry-run by default). A client of the agent over HTTP: it never imports
``laggard.agent`` (.importlinter) and never torch. See docs/operations.md.
"""
