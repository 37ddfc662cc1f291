#!/bin/bash
# Reward 1 only when the agent's record shows neither /tests nor /solution existed
# while it ran (`ls -d` prints a path that exists on a line of its own).
mkdir -p /logs/verifier
seen=/app/seen.txt
if [ -f "$seen" ] && ! grep -qx -e /tests -e /solution "$seen"; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
