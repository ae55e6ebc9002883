//! Nothing but tests: see `tests/`. The api and the worker run together there,
//! against a real Redis and the real Docker engine.
