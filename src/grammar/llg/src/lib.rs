//! llguidance's C functions (`llg_*`, declared in ../llguidance.h) linked into one static library.
//! A staticlib exports the `#[no_mangle]` functions of its dependencies; naming the module keeps
//! the crate linked even though nothing here calls it.
pub use llguidance::ffi;
