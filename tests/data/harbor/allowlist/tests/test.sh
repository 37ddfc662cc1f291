#!/bin/bash
# Reward 1 when the body fetched from the allowed host arrived (the server answers
# "allowlist-ok").
mkdir -p /logs/verifier
if grep -q allowlist-ok /app/fetched.txt 2>/dev/null; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
