//! The collectives' kernel variants: the element types, the reduction operators as the kernels know them
//! and the kernels, with the rule that folds bit-identical twins. The table is `kernels/variants.rs`, which
//! build.rs reads too: it writes the kernels' translation units from it, and the table of entry points
//! `kernels.rs` looks launches up in.

include!("../../kernels/variants.rs");
