"""Sessions: their lifetimes, the reaper that closes expired ones, scene classification
and the session registry of a process.

It must not import the HTTP app.
"""
