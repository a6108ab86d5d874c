"""Process plumbing shared by every actor: Ray start-up and errors, ZMQ calls between actors, CPU scheduling policy, GC tuning, files shipped to nodes."""
