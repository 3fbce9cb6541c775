//! The whole conformance suite on a directory of this machine: each factory a temporary
//! directory of its own.

/// Every rule that applies (the cut-off-holder rules do not: holds last as long as their
/// process; `processes` shows what holds instead).
mod single {
    use testkit::file::FileFactory;
    conformance::conformance_suite!(async { FileFactory::new() });
}
