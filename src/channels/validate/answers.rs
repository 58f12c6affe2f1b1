//! Rules for answers to input requests: each answer against its question
//! (kind, bounds, options), completions against the whole request, and the
//! length limit on free text.

use std::collections::HashMap;

use ahp_types::actions::{ChatInputAnswerChangedAction, ChatInputCompletedAction, StateAction};
use ahp_types::state::{
    ChatInputAnswer, ChatInputAnswerValue, ChatInputQuestion, ChatInputResponseKind, ChatState,
    InputRequestResponsePart, ResponsePart,
};

use super::{reject, Check, Rejection};
use crate::interactions::question_kind;

fn open_input<'a>(
    state: &'a ChatState,
    request_id: &str,
) -> Result<&'a InputRequestResponsePart, Rejection> {
    let Some(turn) = &state.active_turn else {
        // Settled requests of ended turns are in `turns`.
        let settled = state
            .turns
            .iter()
            .flat_map(|t| &t.response_parts)
            .any(|p| matches!(p, ResponsePart::InputRequest(i) if i.request.id == request_id));
        return if settled {
            reject(format!(
                "input request `{request_id}` is already settled (its turn has ended)"
            ))
        } else {
            reject(format!(
                "no open input request `{request_id}`: there is no active turn"
            ))
        };
    };
    let mut settled = false;
    for part in &turn.response_parts {
        if let ResponsePart::InputRequest(i) = part {
            if i.request.id == request_id {
                if i.response.is_none() {
                    return Ok(i);
                }
                settled = true;
            }
        }
    }
    if settled {
        reject(format!("input request `{request_id}` is already settled"))
    } else {
        reject(format!(
            "no open input request `{request_id}` in the active turn"
        ))
    }
}

fn question<'a>(
    req: &'a InputRequestResponsePart,
    qid: &str,
) -> Result<&'a ChatInputQuestion, Rejection> {
    req.request
        .questions
        .iter()
        .flatten()
        .find(|q| question_id(q) == Some(qid))
        .ok_or_else(|| {
            Rejection::new(format!(
                "question `{qid}` is not in request `{}`",
                req.request.id
            ))
        })
}

/// A question's id (`None` for an unknown kind).
pub fn question_id(q: &ChatInputQuestion) -> Option<&str> {
    Some(match q {
        ChatInputQuestion::Text(q) => &q.id,
        ChatInputQuestion::Number(q) | ChatInputQuestion::Integer(q) => &q.id,
        ChatInputQuestion::Boolean(q) => &q.id,
        ChatInputQuestion::SingleSelect(q) => &q.id,
        ChatInputQuestion::MultiSelect(q) => &q.id,
        ChatInputQuestion::Unknown(_) => return None,
    })
}

fn is_required(q: &ChatInputQuestion) -> bool {
    match q {
        ChatInputQuestion::Text(q) => q.required,
        ChatInputQuestion::Number(q) | ChatInputQuestion::Integer(q) => q.required,
        ChatInputQuestion::Boolean(q) => q.required,
        ChatInputQuestion::SingleSelect(q) => q.required,
        ChatInputQuestion::MultiSelect(q) => q.required,
        ChatInputQuestion::Unknown(_) => None,
    }
    .unwrap_or(false)
}

/// Check one answer against its question. Bounds apply to submitted answers
/// only: a draft may pass through invalid states while a person types.
pub fn check_answer(q: &ChatInputQuestion, answer: &ChatInputAnswer) -> Check {
    let (value, submitted) = match answer {
        ChatInputAnswer::Skipped(_) => return Ok(()),
        ChatInputAnswer::Draft(a) => (&a.value, false),
        ChatInputAnswer::Submitted(a) => (&a.value, true),
    };
    let qid = question_id(q).unwrap_or("?");
    match (q, value) {
        (ChatInputQuestion::Text(q), ChatInputAnswerValue::Text(v)) => {
            let len = v.value.chars().count() as i64;
            if submitted {
                if let Some(min) = q.min {
                    if len < min {
                        return reject(format!(
                            "answer to `{qid}` is {len} characters; at least {min} required"
                        ));
                    }
                }
                if let Some(max) = q.max {
                    if len > max {
                        return reject(format!(
                            "answer to `{qid}` is {len} characters; at most {max} allowed"
                        ));
                    }
                }
            }
            Ok(())
        }
        (ChatInputQuestion::Number(q), ChatInputAnswerValue::Number(v))
        | (ChatInputQuestion::Integer(q), ChatInputAnswerValue::Number(v)) => {
            if !v.value.is_finite() {
                return reject(format!("answer to `{qid}` is not a finite number"));
            }
            if submitted {
                if let Some(min) = q.min {
                    if v.value < min {
                        return reject(format!(
                            "answer to `{qid}` is {}; minimum is {min}",
                            v.value
                        ));
                    }
                }
                if let Some(max) = q.max {
                    if v.value > max {
                        return reject(format!(
                            "answer to `{qid}` is {}; maximum is {max}",
                            v.value
                        ));
                    }
                }
            }
            Ok(())
        }
        (ChatInputQuestion::Boolean(_), ChatInputAnswerValue::Boolean(_)) => Ok(()),
        (ChatInputQuestion::SingleSelect(q), ChatInputAnswerValue::Selected(v)) => {
            let freeform = q.allow_freeform_input.unwrap_or(false);
            let known = q.options.iter().any(|o| o.id == v.value);
            if !known && !freeform {
                return reject(format!("option `{}` is not offered by `{qid}`", v.value));
            }
            if v.freeform_values.as_ref().is_some_and(|f| !f.is_empty()) && !freeform {
                return reject(format!("`{qid}` does not allow free-form input"));
            }
            if submitted && !known && v.freeform_values.as_ref().is_none_or(|f| f.is_empty()) {
                return reject(format!(
                    "answer to `{qid}` selects no offered option and has no free-form text"
                ));
            }
            Ok(())
        }
        (ChatInputQuestion::MultiSelect(q), ChatInputAnswerValue::SelectedMany(v)) => {
            let freeform = q.allow_freeform_input.unwrap_or(false);
            if let Some(bad) = v
                .value
                .iter()
                .find(|id| !q.options.iter().any(|o| &o.id == *id))
            {
                return reject(format!("option `{bad}` is not offered by `{qid}`"));
            }
            let mut seen = std::collections::HashSet::new();
            if let Some(dup) = v.value.iter().find(|id| !seen.insert(id.as_str())) {
                return reject(format!("option `{dup}` is selected twice in `{qid}`"));
            }
            let extra = v.freeform_values.as_ref().map_or(0, Vec::len);
            if extra > 0 && !freeform {
                return reject(format!("`{qid}` does not allow free-form input"));
            }
            if submitted {
                let count = (v.value.len() + extra) as i64;
                if let Some(min) = q.min {
                    if count < min {
                        return reject(format!(
                            "`{qid}` needs at least {min} selections; got {count}"
                        ));
                    }
                }
                if let Some(max) = q.max {
                    if count > max {
                        return reject(format!(
                            "`{qid}` allows at most {max} selections; got {count}"
                        ));
                    }
                }
            }
            Ok(())
        }
        (ChatInputQuestion::Unknown(_), _) => {
            reject(format!("question `{qid}` has an unknown kind"))
        }
        (q, v) => reject(format!(
            "a `{}` answer does not fit `{qid}`, a `{}` question",
            value_kind(v),
            question_kind(q)
        )),
    }
    .and_then(|()| integer_check(q, value, qid))
}

// Integer questions take only whole numbers, drafts included: a draft of 2.5
// could never become valid without changing kind.
fn integer_check(q: &ChatInputQuestion, value: &ChatInputAnswerValue, qid: &str) -> Check {
    if let (ChatInputQuestion::Integer(_), ChatInputAnswerValue::Number(v)) = (q, value) {
        if v.value.fract() != 0.0 {
            return reject(format!(
                "`{qid}` is an integer question; {} is not a whole number",
                v.value
            ));
        }
    }
    Ok(())
}

fn value_kind(v: &ChatInputAnswerValue) -> &'static str {
    match v {
        ChatInputAnswerValue::Text(_) => "text",
        ChatInputAnswerValue::Number(_) => "number",
        ChatInputAnswerValue::Boolean(_) => "boolean",
        ChatInputAnswerValue::Selected(_) => "selected",
        ChatInputAnswerValue::SelectedMany(_) => "selected-many",
        ChatInputAnswerValue::Unknown(_) => "unknown",
    }
}

/// `chat/inputAnswerChanged`.
pub fn input_answer_changed(state: &ChatState, a: &ChatInputAnswerChangedAction) -> Check {
    let req = open_input(state, &a.request_id)?;
    let q = question(req, &a.question_id)?;
    match &a.answer {
        None => Ok(()),
        Some(answer) => check_answer(q, answer),
    }
}

/// `chat/inputCompleted`.
pub fn input_completed(state: &ChatState, a: &ChatInputCompletedAction) -> Check {
    let req = open_input(state, &a.request_id)?;
    let mut merged: HashMap<&str, &ChatInputAnswer> = req
        .request
        .answers
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    for (qid, answer) in a.answers.iter().flatten() {
        let q = question(req, qid)?;
        check_answer(q, answer)?;
        merged.insert(qid.as_str(), answer);
    }
    if a.response == ChatInputResponseKind::Accept {
        for q in req.request.questions.iter().flatten() {
            let Some(qid) = question_id(q) else { continue };
            match merged.get(qid) {
                Some(ChatInputAnswer::Submitted(_)) => {
                    // Drafts were checked without bounds; a submitted draft
                    // carried over must satisfy them now.
                    if let Some(answer) = merged.get(qid) {
                        check_answer(q, answer)?;
                    }
                }
                _ if is_required(q) => {
                    return reject(format!(
                        "cannot accept: required question `{qid}` has no submitted answer"
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Text answers and free-form values longer than `max` characters are refused.
pub fn answer_lengths(action: &StateAction, max: usize) -> Result<(), Rejection> {
    use ahp_types::state::{ChatInputAnswer as A, ChatInputAnswerValue as V};
    let answers: Vec<&A> = match action {
        StateAction::ChatInputAnswerChanged(a) => a.answer.iter().collect(),
        StateAction::ChatInputCompleted(a) => a.answers.iter().flat_map(|m| m.values()).collect(),
        _ => return Ok(()),
    };
    for a in answers {
        let texts: Vec<&str> = match a {
            A::Draft(x) | A::Submitted(x) => match &x.value {
                V::Text(t) => vec![t.value.as_str()],
                V::Selected(s) => s
                    .freeform_values
                    .iter()
                    .flatten()
                    .map(String::as_str)
                    .collect(),
                V::SelectedMany(s) => s
                    .freeform_values
                    .iter()
                    .flatten()
                    .map(String::as_str)
                    .collect(),
                _ => Vec::new(),
            },
            A::Skipped(s) => s
                .freeform_values
                .iter()
                .flatten()
                .map(String::as_str)
                .collect(),
        };
        if let Some(t) = texts.iter().find(|t| t.chars().count() > max) {
            return Err(Rejection::new(format!(
                "an answer of {} characters is over the limit of {max}",
                t.chars().count()
            )));
        }
    }
    Ok(())
}
