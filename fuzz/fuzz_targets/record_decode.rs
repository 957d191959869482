//! `StoredValue::decode` over arbitrary bytes: never panics, and whatever decodes encodes and
//! decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_idempotency::store::record::StoredValue;

fuzz_target!(|data: &[u8]| {
    match StoredValue::decode(data) {
        Ok(StoredValue::Completed(record)) => {
            let again = StoredValue::decode(&record.encode()).expect("a record re-decodes");
            assert_eq!(again, StoredValue::Completed(record));
        }
        Ok(StoredValue::InFlight { token, fingerprint }) => {
            let encoded = StoredValue::encode_in_flight(&token, &fingerprint);
            assert_eq!(&encoded[..], data);
        }
        Err(_) => {}
    }
});
