#!/bin/bash
# Whatever happened, this task scores 0 (a dataset check must flag it).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
