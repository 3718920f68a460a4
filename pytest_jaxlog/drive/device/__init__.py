"""The device program and its buffers. What enters: the schema and identity ``prepare`` found.
What leaves: the plan laid out for a chunk capacity (``plan``), the compiled chunk program (``n <= C`` steps in one device loop, in blocks of a compile-time length), the
record buffers of the chunks in flight and the frames pulled from them, and the memory bound
that holds for them."""
