//! Any byte string must parse or return an error: never panic, never read out of bounds,
//! never allocate without bound. Whatever parses must give in-bounds tensor slices.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pyllama_core::gguf::{GgufFile, Storage};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = GgufFile::from_storage("fuzz.gguf", Storage::from_bytes(data)) {
        for t in &f.tensors {
            let d = f.tensor_data(t);
            assert_eq!(d.len() as u64, t.nbytes);
        }
    }
});
