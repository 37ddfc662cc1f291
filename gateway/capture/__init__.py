"""Capture: what a call leaves on disk and what is rebuilt from it — the session store
and its group commit, the recorded call, the trajectory view, revival after a restart,
retries answered from the record and the reply derived from sampled ids.

It must not import the HTTP app, calls, sessions, observability or engines.
"""
