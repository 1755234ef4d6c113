"""``pflower sim``: runs on this machine, every client in this process or its workers.

The engines (in-process, parallel, batched, together) and the Ray path all hand Flower
messages to the same client code the SuperNodes run; this is the one part of pflower that
imports both the server side (:mod:`pflower.server_app`) and the client side
(:mod:`pflower.client_app`)."""
