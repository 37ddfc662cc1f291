#!/bin/bash
# Reward 1 only when the agent's record shows it saw nothing of the task's hidden
# files while it ran: no file in /solution nor in /tests (the sandbox may keep them
# as empty dirs). Every line must be `ls` failing to find something; none may be a file.
mkdir -p /logs/verifier
seen=/app/seen.txt
if [ -f "$seen" ] && ! grep -qv '^ls: cannot access' "$seen"; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
