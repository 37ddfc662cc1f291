"""Runs that push the real stack hard and check that nothing is lost or broken.

What it owns:

- ``chaos``: rollouts through the real processes while each part is SIGKILLed and
  restarted, then checked for lost rollouts, duplicated or inexact samples and leftovers;
  ``chaos_agent`` is the program each of its sandboxes runs;
- ``malformed_requests``: generated malformed requests per protocol (``hypothesis``) and
  the check that an error reply is in its protocol's shape;
- ``fuzz``: sending those requests to a Gateway and tallying the replies.

Used by ``tests`` (the short variants) and ``bench`` (the long runs with their figures);
only they import it. It drives the product's own packages and the ``devstack`` stand-ins,
and never imports ``tests``, ``bench`` or ``workers`` (it starts workers as processes).
"""
