//! JSON-RPC decoding and the typed params of every routed method: arbitrary
//! bytes must never panic, and whatever decodes must re-encode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tandem::protocol::{self, methods as m};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let inc = match protocol::decode(text) {
        Ok(inc) => inc,
        Err((id, err)) => {
            let _ = protocol::encode_error(&id, &err);
            return;
        }
    };
    use ahp_types::commands::*;
    let p = inc.params.clone();
    let _ = match inc.method.as_str() {
        m::INITIALIZE => m::decode_params::<InitializeParams>(&inc.method, p).map(|_| ()),
        m::RECONNECT => m::decode_params::<ReconnectParams>(&inc.method, p).map(|_| ()),
        m::SUBSCRIBE => m::decode_params::<SubscribeParams>(&inc.method, p).map(|_| ()),
        m::UNSUBSCRIBE => m::decode_params::<UnsubscribeParams>(&inc.method, p).map(|_| ()),
        m::DISPATCH_ACTION => m::decode_params::<DispatchActionParams>(&inc.method, p).map(|d| {
            // Every action that decodes serializes back.
            let _ = serde_json::to_string(&d.action).expect("actions re-encode");
        }),
        m::CREATE_SESSION => m::decode_params::<CreateSessionParams>(&inc.method, p).map(|_| ()),
        m::LIST_SESSIONS => m::decode_params::<ListSessionsParams>(&inc.method, p).map(|_| ()),
        m::CREATE_CHAT => m::decode_params::<CreateChatParams>(&inc.method, p).map(|_| ()),
        m::FETCH_TURNS => m::decode_params::<FetchTurnsParams>(&inc.method, p).map(|_| ()),
        _ => Ok(()),
    };
    if let Some(id) = &inc.id {
        let params = match &inc.params {
            protocol::Params::Value(v) => v.clone(),
            protocol::Params::Raw(raw) => {
                serde_json::from_str(raw.get()).expect("raw params are JSON")
            }
        };
        let _ = protocol::encode_result(id, &params);
    }
});
