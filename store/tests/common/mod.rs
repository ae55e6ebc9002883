//! The shared test kit (a Redis per test, the binaries as processes), under the
//! name every test file here imports it by.

pub use testkit::*;
