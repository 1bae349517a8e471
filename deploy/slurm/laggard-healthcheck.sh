#!/bin/sh
# Slurm's HealthCheckProgram running `laggard healthcheck --slurm` (docs/operations.md).
#
# slurm.conf:
#   HealthCheckProgram=/usr/local/sbin/laggard-healthcheck
#   HealthCheckInterval=300
#   HealthCheckNodeState=ANY
#
# slurmd runs it as root with no arguments and an environment holding only SLURMD_NODENAME (the
# node's Slurm name, which laggard drains). On a problem it drains this node with the reason
# laggard:<kind>:<subject>; it never touches a node another drained.
#
# Dry run first: it only logs what it would drain (audit lines, outcome=would_act). Once the
# log shows the drains you want, set LAGGARD_HEALTHCHECK_FLAGS="--act" below.
: "${LAGGARD_HEALTHCHECK_FLAGS=}"
: "${LAGGARD:=laggard}"
: "${LAGGARD_HEALTHCHECK_LOG:=/var/log/laggard-healthcheck.log}"
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
# shellcheck disable=SC2086 # the flags are words
exec "$LAGGARD" healthcheck --slurm $LAGGARD_HEALTHCHECK_FLAGS >>"$LAGGARD_HEALTHCHECK_LOG" 2>&1
