#!/bin/bash
python3 -c 'import os, urllib.request; print(urllib.request.urlopen(os.environ["ALLOWLIST_URL"], timeout=20).read().decode())' > /app/fetched.txt
