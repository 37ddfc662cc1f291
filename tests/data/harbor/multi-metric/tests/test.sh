#!/bin/bash
# reward.json: the reward plus two metrics recorded with every sample.
mkdir -p /logs/verifier
f=/app/numbers.txt
lines=$(awk 'NF { n++ } END { print n + 0 }' "$f" 2>/dev/null)
total=$(awk '{ s += $1 } END { print s + 0 }' "$f" 2>/dev/null)
if [ "$(cat "$f" 2>/dev/null)" = "$(printf '1\n2\n3\n4\n5')" ]; then reward=1; else reward=0; fi
printf '{"reward": %s, "line_count": %s, "sum": %s}\n' "$reward" "${lines:-0}" "${total:-0}" \
  > /logs/verifier/reward.json
