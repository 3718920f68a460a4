"""The device program and its buffers. What enters: the checked options and the state, which
``plan`` resolves (with ``prepare``'s schema and identity) into the run's lanes, schema and plan.
What leaves: the plan laid out for a chunk capacity (``plan``), the compiled chunk program (``n <= C`` steps in one device loop, in blocks of a compile-time length), the
record buffers of the chunks in flight and the frames pulled from them, and the memory bound
that holds for them."""
