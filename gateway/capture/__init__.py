"""Capture: what a call leaves on disk and what is rebuilt from it — the session store
and its group commit, the recorded call, the trajectory view, revival after a restart,
answered retries and the replies derived from sampled ids.

It must not import the HTTP app, sessions, calls or engines.
"""
