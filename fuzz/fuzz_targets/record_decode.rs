//! `Record::decode` over arbitrary bytes: never panics, and whatever decodes encodes and
//! decodes to the same record. (The in-flight values share the decoder; their round trip is a
//! property test of `store::record`.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_idempotency::store::record::Record;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = Record::decode(data) {
        let again = Record::decode(&record.encode()).expect("a record re-decodes");
        assert_eq!(again, record);
    }
});
