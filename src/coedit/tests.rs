use proptest::prelude::*;

use super::*;

fn op(parts: serde_json::Value) -> TextOp {
    serde_json::from_value(parts).expect("valid op")
}

fn u(s: &str) -> Vec<u16> {
    s.encode_utf16().collect()
}

#[test]
fn an_op_walks_the_whole_text_and_keeps_a_canonical_form() {
    let o = op(serde_json::json!([2, "xy", -1, 1]));
    assert_eq!((o.base_len(), o.target_len()), (4, 5));
    assert_eq!(o.apply_str("abcd").unwrap(), "abxyd");
    assert_eq!(
        o.apply_str("abc"),
        Err(OpError::Length { op: 4, text: 3 }),
        "a text of another length"
    );
    // Neighbours merge, and an insert goes before a delete at one place.
    let mut built = TextOp::new();
    built
        .retain(1)
        .retain(1)
        .delete(1)
        .insert_str("x")
        .insert_str("y");
    built.retain(1);
    assert_eq!(built, op(serde_json::json!([2, "xy", -1, 1])));
    assert_eq!(
        serde_json::to_value(&built).unwrap(),
        serde_json::json!([2, "xy", -1, 1])
    );
    for bad in [
        serde_json::json!([0]),
        serde_json::json!([""]),
        serde_json::json!([1.5]),
        serde_json::json!({"retain": 1}),
    ] {
        assert!(
            serde_json::from_value::<TextOp>(bad.clone()).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn positions_count_utf16_units_and_a_character_is_never_split() {
    // 😀 is two units.
    let text = "a😀b";
    let ins = op(serde_json::json!([3, "!", 1]));
    assert_eq!(ins.apply_str(text).unwrap(), "a😀!b");
    let split = op(serde_json::json!([2, "!", 2]));
    assert_eq!(split.apply_str(text), Err(OpError::SplitsCharacter));
    let half = op(serde_json::json!([1, -1, 2]));
    assert_eq!(half.apply_str(text), Err(OpError::SplitsCharacter));
}

#[test]
fn compose_is_one_then_the_other() {
    let a = op(serde_json::json!([1, "XY", -1, 2]));
    let b = op(serde_json::json!([2, -2, "z", 1]));
    let ab = a.compose(&b).unwrap();
    let text = "abcd";
    assert_eq!(
        ab.apply_str(text).unwrap(),
        b.apply_str(&a.apply_str(text).unwrap()).unwrap()
    );
    assert!(a.compose(&a).is_err(), "lengths must meet");
}

#[test]
fn transform_keeps_both_inserts_and_deletes_once() {
    let text = "hello world";
    let a = op(serde_json::json!([5, " there", 6]));
    let b = op(serde_json::json!([5, -6, "!"]));
    let (a2, b2) = TextOp::transform(&a, &b).unwrap();
    let via_a = b2.apply_str(&a.apply_str(text).unwrap()).unwrap();
    let via_b = a2.apply_str(&b.apply_str(text).unwrap()).unwrap();
    assert_eq!(via_a, via_b);
    assert_eq!(via_a, "hello there!");
    // Both insert at one place: the first operation's text goes first.
    let x = op(serde_json::json!([2, "X", 9]));
    let y = op(serde_json::json!([2, "Y", 9]));
    let (x2, y2) = TextOp::transform(&x, &y).unwrap();
    assert_eq!(
        x2.apply_str(&y.apply_str(text).unwrap()).unwrap(),
        "heXYllo world"
    );
    assert_eq!(
        y2.apply_str(&x.apply_str(text).unwrap()).unwrap(),
        "heXYllo world"
    );
    // Both delete overlapping ranges.
    let d1 = op(serde_json::json!([1, -5, 5]));
    let d2 = op(serde_json::json!([3, -5, 3]));
    let (d1b, d2b) = TextOp::transform(&d1, &d2).unwrap();
    let r1 = d2b.apply_str(&d1.apply_str(text).unwrap()).unwrap();
    let r2 = d1b.apply_str(&d2.apply_str(text).unwrap()).unwrap();
    assert_eq!((r1.as_str(), r2.as_str()), ("hrld", "hrld"));
}

#[test]
fn a_caret_moves_with_the_text_around_it() {
    let o = op(serde_json::json!([2, "XX", -3, 4]));
    // Before the change, at it, inside the deleted range, after it.
    for own in [false, true] {
        assert_eq!(o.transform_index(1, own), 1);
        assert_eq!(
            o.transform_index(4, own),
            4,
            "to the start of what replaced it"
        );
        assert_eq!(o.transform_index(5, own), 4);
        assert_eq!(o.transform_index(7, own), 6);
    }
    // Text inserted exactly at a caret: after one's own, before others'.
    assert_eq!(o.transform_index(2, false), 4);
    assert_eq!(o.transform_index(2, true), 2);
    let del = op(serde_json::json!([1, -2, 1]));
    assert_eq!(del.transform_index(1, true), 1);
    assert_eq!(del.transform_index(3, true), 1);
    assert_eq!(del.transform_index(4, false), 2);
}

#[test]
fn diff_finds_each_change_character_by_character() {
    let (a, b) = ("the quick fox", "a quick brown fox!");
    let d = TextOp::diff(&u(a), &u(b));
    assert_eq!(d.apply_str(a).unwrap(), b);
    // Unchanged runs are retained, not rewritten.
    let retained: usize = d
        .steps()
        .iter()
        .map(|s| match s {
            Step::Retain(n) => *n,
            _ => 0,
        })
        .sum();
    assert!(retained >= "quick fox".len(), "{d:?}");
    let e = TextOp::diff(&u("a😀b"), &u("a😁b"));
    assert_eq!(e.apply_str("a😀b").unwrap(), "a😁b");
}

#[test]
fn the_authority_carries_an_old_edit_forward_and_takes_each_once() {
    let mut doc = TextDoc::new("abc", 7, 10, 100);
    let first = op(serde_json::json!([3, "1"]));
    let Taken::Applied(e) = doc.edit("A", 1, 7, &first).unwrap() else {
        panic!("applied")
    };
    assert_eq!((e.rev, doc.text().as_str()), (8, "abc1"));
    // B typed at the start on revision 7, not knowing A's edit.
    let b = op(serde_json::json!(["0", 3]));
    let Taken::Applied(e) = doc.edit("B", 1, 7, &b).unwrap() else {
        panic!("applied")
    };
    assert_eq!(e.op, op(serde_json::json!(["0", 4])));
    assert_eq!(doc.text(), "0abc1");
    // A's edit again (a reconnect): taken once.
    assert_eq!(doc.edit("A", 1, 7, &first).unwrap(), Taken::Duplicate);
    assert_eq!((doc.rev(), doc.taken_from("A")), (9, 1));
    assert_eq!(doc.since(7).unwrap().len(), 2);
    assert!(matches!(
        doc.edit("A", 2, 10, &op(serde_json::json!([5]))),
        Err(EditError::Ahead { base: 10, rev: 9 })
    ));
    assert!(matches!(
        doc.edit("C", 1, 9, &op(serde_json::json!([4]))),
        Err(EditError::Op(OpError::Length { .. }))
    ));
}

#[test]
fn an_edit_older_than_the_kept_ones_must_rebase() {
    let mut doc = TextDoc::new("", 0, 2, 100);
    for i in 0..3u64 {
        let mut o = TextOp::new();
        o.retain(i as usize).insert_str("x");
        doc.edit("A", i + 1, i, &o).unwrap();
    }
    assert!(doc.since(0).is_none());
    assert_eq!(doc.since(1).unwrap().len(), 2);
    assert!(matches!(
        doc.edit("B", 1, 0, &op(serde_json::json!(["y"]))),
        Err(EditError::Behind { base: 0, oldest: 1 })
    ));
}

#[test]
fn a_whole_text_change_is_an_edit_and_the_length_is_bounded() {
    let mut doc = TextDoc::new("hello", 0, 10, 8);
    let e = doc.replace("help").unwrap().expect("changed");
    assert_eq!((e.rev, e.author.as_str(), e.seq), (1, "", 0));
    assert_eq!(e.op.apply_str("hello").unwrap(), "help");
    assert_eq!(doc.replace("help").unwrap(), None);
    assert!(matches!(
        doc.replace("help me now"),
        Err(EditError::TooLong { len: 11, max: 8 })
    ));
    // An editor on revision 0 typed at the end of "hello".
    let Taken::Applied(e) = doc
        .edit("A", 1, 0, &op(serde_json::json!([5, "!"])))
        .unwrap()
    else {
        panic!("applied")
    };
    assert_eq!(e.rev, 2);
    assert_eq!(doc.text(), "help!");
}

#[test]
fn an_editor_sends_one_edit_at_a_time_and_carries_others_over_its_own() {
    let mut doc = TextDoc::new("ab", 0, 10, 100);
    let mut a = TextClient::new("A", "ab", 0);
    let mut b = TextClient::new("B", "ab", 0);
    let sent = a.local(op(serde_json::json!([2, "1"]))).unwrap().unwrap();
    assert_eq!(
        a.local(op(serde_json::json!([3, "2"]))).unwrap(),
        None,
        "waits"
    );
    let b_sent = b.local(op(serde_json::json!(["0", 2]))).unwrap().unwrap();
    let Taken::Applied(eb) = doc.edit("B", b_sent.seq, b_sent.base, &b_sent.op).unwrap() else {
        panic!()
    };
    let Taken::Applied(ea) = doc.edit("A", sent.seq, sent.base, &sent.op).unwrap() else {
        panic!()
    };
    // A sees B's edit, then its own taken: its buffered typing goes next.
    assert_eq!(
        a.receive(&eb).unwrap(),
        Received::Remote(op(serde_json::json!(["0", 4])))
    );
    assert_eq!(a.text(), "0ab12");
    let Received::Acked(Some(next)) = a.receive(&ea).unwrap() else {
        panic!("acked with the buffer to send")
    };
    assert_eq!((next.seq, next.base), (2, 2));
    b.receive(&eb).unwrap();
    b.receive(&ea).unwrap();
    let Taken::Applied(e2) = doc.edit("A", next.seq, next.base, &next.op).unwrap() else {
        panic!()
    };
    assert_eq!(a.receive(&e2).unwrap(), Received::Acked(None));
    b.receive(&e2).unwrap();
    assert!(a.settled() && b.settled());
    assert_eq!(
        (a.text(), b.text(), doc.text()),
        ("0ab12".into(), "0ab12".into(), "0ab12".into())
    );
    assert!(matches!(
        b.receive(&Edit {
            rev: 9,
            author: "C".into(),
            seq: 1,
            op: op(serde_json::json!([5]))
        }),
        Err(ClientError::Gap { have: 3, got: 9 })
    ));
}

// ---- Properties of single operations ------------------------------------

/// A text over a small alphabet with a two-unit character in it.
fn text_strategy() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![Just('a'), Just('b'), Just('é'), Just('😀')],
        0..12,
    )
    .prop_map(|cs| cs.into_iter().collect())
}

/// A random operation over `text` that respects character boundaries.
fn op_on(text: &str, picks: &[(u8, u8)]) -> TextOp {
    let chars: Vec<char> = text.chars().collect();
    let mut o = TextOp::new();
    let mut k = 0;
    for (kind, pick) in picks {
        if *kind % 3 == 2 {
            o.insert_str(["x", "y😁"][*pick as usize % 2]);
            continue;
        }
        if k >= chars.len() {
            break;
        }
        let n = (*pick as usize % 3 + 1).min(chars.len() - k);
        let units: usize = chars[k..k + n].iter().map(|c| c.len_utf16()).sum();
        match kind % 3 {
            0 => {
                o.retain(units);
                k += n;
            }
            _ => {
                o.delete(units);
                k += n;
            }
        }
    }
    let rest: usize = chars[k..].iter().map(|c| c.len_utf16()).sum();
    o.retain(rest);
    if picks.len() % 2 == 1 {
        o.insert_str("z");
    }
    o
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// Two edits of one text, transformed, lead to the same text in either
    /// order; composing is applying one then the other; the wire form
    /// round-trips; a diff rebuilds its target.
    #[test]
    fn transform_compose_and_diff_agree(
        text in text_strategy(),
        pa in proptest::collection::vec((0u8..3, 0u8..4), 0..8),
        pb in proptest::collection::vec((0u8..3, 0u8..4), 0..8),
        other in text_strategy(),
    ) {
        let (a, b) = (op_on(&text, &pa), op_on(&text, &pb));
        let (a2, b2) = TextOp::transform(&a, &b).unwrap();
        let via_a = b2.apply_str(&a.apply_str(&text).unwrap()).unwrap();
        let via_b = a2.apply_str(&b.apply_str(&text).unwrap()).unwrap();
        prop_assert_eq!(&via_a, &via_b);
        let after_a = a.apply_str(&text).unwrap();
        let c = op_on(&after_a, &pb);
        let ac = a.compose(&c).unwrap();
        prop_assert_eq!(ac.apply_str(&text).unwrap(), c.apply_str(&after_a).unwrap());
        let wire = serde_json::to_string(&a).unwrap();
        let back: TextOp = serde_json::from_str(&wire).unwrap();
        // A no-op over the empty text has no steps and reads back as such.
        prop_assert_eq!(back, a);
        let d = TextOp::diff(&u(&text), &u(&other));
        prop_assert_eq!(d.apply_str(&text).unwrap(), other);
    }
}
