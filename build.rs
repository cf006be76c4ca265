// Temporary: compiles the C++ part. The header generation lands with the build system.
fn main() {
    println!("cargo:rerun-if-changed=src/cxx/registered_memory.cpp");
    cc::Build::new()
        .cpp(true)
        .file("src/cxx/registered_memory.cpp")
        .flag("-std=c++17")
        .compile("mscclpp_cxx");
}
