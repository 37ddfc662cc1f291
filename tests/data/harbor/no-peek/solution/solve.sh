#!/bin/bash
# The oracle itself runs from /solution, so it records only whether /tests existed.
ls -d /tests > /app/seen.txt 2>&1
true
