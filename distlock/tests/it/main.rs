//! The facade: connecting by URL, a custom backend, secrets kept out of output; one
//! test binary.

mod connect;
mod custom_backend;
mod secrets;
