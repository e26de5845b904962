#!/bin/sh
# One Consort worker: a fresh clone of the project, then `consort run --parallel N`, which takes
# the next feature of the shared backlog that no process holds, takes over one whose holder
# stopped renewing its lease, and ends when every feature is done or waits at a gate.
#
# Environment:
#   CONSORT_REPOSITORY  the git URL to clone (credentials from git's own configuration)
#   CONSORT_BRANCH      the base branch (default: the remote's default branch)
#   CONSORT_PARALLEL    features at once in this worker (default 1)
#   CONSORT_APPROVE_AS  approve every gate as this person (default: none; gates wait for people)
#   and the variables consort.toml names: [store] url_env, [database] url_env, the agents' keys.
set -eu
: "${CONSORT_REPOSITORY:?set CONSORT_REPOSITORY to the project's git URL}"
work="${CONSORT_WORKDIR:-$HOME/project}"
if [ ! -d "$work/.git" ]; then
  if [ -n "${CONSORT_BRANCH:-}" ]; then
    git clone --quiet --branch "$CONSORT_BRANCH" "$CONSORT_REPOSITORY" "$work"
  else
    git clone --quiet "$CONSORT_REPOSITORY" "$work"
  fi
fi
set -- run --dir "$work" --parallel "${CONSORT_PARALLEL:-1}"
if [ -n "${CONSORT_APPROVE_AS:-}" ]; then
  set -- "$@" --approve-as "$CONSORT_APPROVE_AS"
fi
exec consort "$@"
