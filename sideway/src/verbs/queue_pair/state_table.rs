//! The IB spec's queue pair state table: for each transition and QP type, which attributes
//! `ibv_modify_qp` requires and which it allows (IBA vol. 1, chapter 11, "Modify Queue Pair";
//! the Linux kernel checks the same rules). Only consulted to explain a failed modify.

use super::attr::{QpAttrMask, QpState, QpType};

/// What one state transition requires and allows, for one QP type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransitionRule {
    /// Attributes that must be in the mask (besides `STATE`).
    pub required: QpAttrMask,
    /// Attributes that may be in the mask.
    pub optional: QpAttrMask,
}

/// The transport families whose attribute rules differ.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Ud,
    Uc,
    Rc,
    XrcIni,
    XrcTgt,
    Raw,
}

fn family(qp_type: QpType) -> Option<Family> {
    Some(match qp_type {
        QpType::Ud => Family::Ud,
        QpType::Uc => Family::Uc,
        QpType::Rc => Family::Rc,
        QpType::XrcSend => Family::XrcIni,
        QpType::XrcRecv => Family::XrcTgt,
        QpType::RawPacket => Family::Raw,
        _ => return None,
    })
}

/// The rule for moving a `qp_type` QP from `cur` to `next`, or `None` when the spec has no
/// such transition (or this crate has no table for the QP type or states).
pub fn transition_rule(qp_type: QpType, cur: QpState, next: QpState) -> Option<TransitionRule> {
    use QpAttrMask as M;
    use QpState::*;
    let fam = family(qp_type)?;
    let none = M::empty();
    let rule = |required: M, optional: M| Some(TransitionRule { required, optional });
    // The connected families' common path attributes.
    let path_mig = M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE;
    match (cur, next) {
        // Every state may be reset or moved to Error, with nothing else in the mask.
        (Reset | Init | Rtr | Rts | Sqd | Sqe | Err, Reset | Err) => rule(none, none),
        (Reset, Init) => match fam {
            Family::Ud => rule(M::PKEY_INDEX | M::PORT | M::QKEY, none),
            Family::Raw => rule(M::PORT, none),
            _ => rule(M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        },
        (Init, Init) => match fam {
            Family::Ud => rule(none, M::PKEY_INDEX | M::PORT | M::QKEY),
            Family::Raw => rule(none, none),
            _ => rule(none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        },
        (Init, Rtr) => {
            let connected = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
            let responder = M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
            let opt = M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX;
            match fam {
                Family::Ud => rule(none, M::PKEY_INDEX | M::QKEY),
                Family::Raw => rule(none, none),
                Family::Uc | Family::XrcIni => rule(connected, opt),
                Family::Rc | Family::XrcTgt => rule(connected | responder, opt),
            }
        }
        (Rtr, Rts) => match fam {
            Family::Ud => rule(M::SQ_PSN, M::CUR_STATE | M::QKEY),
            Family::Raw => rule(none, M::RATE_LIMIT),
            Family::Uc => rule(M::SQ_PSN, M::CUR_STATE | path_mig),
            Family::Rc | Family::XrcIni => rule(
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE
                    | path_mig
                    | if fam == Family::Rc {
                        M::MIN_RNR_TIMER
                    } else {
                        none
                    },
            ),
            Family::XrcTgt => rule(
                M::SQ_PSN | M::TIMEOUT,
                M::CUR_STATE | path_mig | M::MIN_RNR_TIMER,
            ),
        },
        (Rts, Rts) | (Sqd, Rts) => match fam {
            Family::Ud => rule(none, M::CUR_STATE | M::QKEY),
            Family::Raw => rule(none, M::RATE_LIMIT),
            Family::Uc | Family::XrcIni => rule(none, M::CUR_STATE | path_mig),
            Family::Rc | Family::XrcTgt => rule(none, M::CUR_STATE | path_mig | M::MIN_RNR_TIMER),
        },
        (Rts, Sqd) => match fam {
            Family::Raw => None,
            _ => rule(none, M::EN_SQD_ASYNC_NOTIFY),
        },
        (Sqd, Sqd) => match fam {
            Family::Ud => rule(none, M::PKEY_INDEX | M::QKEY),
            Family::Raw => None,
            Family::Uc => rule(none, M::AV | M::PKEY_INDEX | path_mig),
            Family::Rc => rule(
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | path_mig,
            ),
            Family::XrcIni => rule(
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::PKEY_INDEX
                    | path_mig,
            ),
            Family::XrcTgt => rule(
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::MAX_DEST_RD_ATOMIC
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | path_mig,
            ),
        },
        // Only unreliable services have a send-queue error state to recover from.
        (Sqe, Rts) => match fam {
            Family::Ud => rule(none, M::CUR_STATE | M::QKEY),
            Family::Uc => rule(none, M::CUR_STATE | M::ACCESS_FLAGS),
            _ => None,
        },
        _ => None,
    }
}

/// What is wrong with a modify's attribute mask, by the state table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskDiagnosis {
    /// The spec has no transition from the current state to the target for this QP type.
    NoSuchTransition,
    /// The transition exists; these attributes are missing or not allowed (both empty when
    /// the mask fits the table, so a value must be out of range instead).
    Attributes {
        /// Required but not in the mask.
        missing: QpAttrMask,
        /// In the mask but not allowed for this transition.
        not_allowed: QpAttrMask,
    },
    /// This crate has no table for the QP type or one of the states.
    Unknown,
}

/// Checks `mask` against the rule for `cur` → `next` (`next == cur` when the mask has no
/// `STATE` bit).
pub fn diagnose(qp_type: QpType, cur: QpState, next: QpState, mask: QpAttrMask) -> MaskDiagnosis {
    let known_state = |s| !matches!(s, QpState::Unknown(_));
    if family(qp_type).is_none() || !known_state(cur) || !known_state(next) {
        return MaskDiagnosis::Unknown;
    }
    let Some(rule) = transition_rule(qp_type, cur, next) else {
        return MaskDiagnosis::NoSuchTransition;
    };
    let allowed = rule.required | rule.optional | QpAttrMask::STATE;
    MaskDiagnosis::Attributes {
        missing: rule.required - mask,
        not_allowed: mask - allowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpAttrMask as M;

    #[test]
    fn rc_connection_sequence_fits_the_table() {
        let init = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
        let rtr = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        let rts =
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
        let ok = MaskDiagnosis::Attributes {
            missing: M::empty(),
            not_allowed: M::empty(),
        };
        assert_eq!(
            diagnose(QpType::Rc, QpState::Reset, QpState::Init, init),
            ok
        );
        assert_eq!(diagnose(QpType::Rc, QpState::Init, QpState::Rtr, rtr), ok);
        assert_eq!(diagnose(QpType::Rc, QpState::Rtr, QpState::Rts, rts), ok);
    }

    #[test]
    fn missing_and_extra_bits_are_named() {
        // Init -> RTR for RC without the responder resources, but with a port.
        let mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::PORT;
        assert_eq!(
            diagnose(QpType::Rc, QpState::Init, QpState::Rtr, mask),
            MaskDiagnosis::Attributes {
                missing: M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
                not_allowed: M::PORT,
            }
        );
        // UC needs no responder resources, and UD needs neither a path nor a QPN.
        let uc = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
        assert_eq!(
            diagnose(QpType::Uc, QpState::Init, QpState::Rtr, uc),
            MaskDiagnosis::Attributes {
                missing: M::empty(),
                not_allowed: M::empty()
            }
        );
        assert_eq!(
            diagnose(QpType::Ud, QpState::Init, QpState::Rtr, uc),
            MaskDiagnosis::Attributes {
                missing: M::empty(),
                not_allowed: M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN
            }
        );
        // UD Reset -> Init needs a Q_Key, not access flags.
        assert_eq!(
            diagnose(
                QpType::Ud,
                QpState::Reset,
                QpState::Init,
                M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS
            ),
            MaskDiagnosis::Attributes {
                missing: M::QKEY,
                not_allowed: M::ACCESS_FLAGS
            }
        );
    }

    #[test]
    fn impossible_transitions_and_unknowns() {
        assert_eq!(
            diagnose(QpType::Rc, QpState::Reset, QpState::Rts, M::STATE),
            MaskDiagnosis::NoSuchTransition
        );
        assert_eq!(
            diagnose(QpType::Rc, QpState::Sqe, QpState::Rts, M::STATE),
            MaskDiagnosis::NoSuchTransition
        );
        assert!(transition_rule(QpType::Uc, QpState::Sqe, QpState::Rts).is_some());
        assert_eq!(
            diagnose(QpType::Driver, QpState::Init, QpState::Rtr, M::STATE),
            MaskDiagnosis::Unknown
        );
        assert_eq!(
            diagnose(QpType::Rc, QpState::from(42), QpState::Rtr, M::STATE),
            MaskDiagnosis::Unknown
        );
        // Any state may go to Error or Reset, with nothing more.
        for s in [QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd] {
            let r = transition_rule(QpType::Rc, s, QpState::Err).unwrap();
            assert!(r.required.is_empty() && r.optional.is_empty());
        }
    }

    #[test]
    fn rts_needs_retry_settings_only_on_reliable_types() {
        let rc = transition_rule(QpType::Rc, QpState::Rtr, QpState::Rts).unwrap();
        assert!(rc
            .required
            .contains(M::RETRY_CNT | M::RNR_RETRY | M::TIMEOUT));
        let uc = transition_rule(QpType::Uc, QpState::Rtr, QpState::Rts).unwrap();
        assert_eq!(uc.required, M::SQ_PSN);
        assert!(!uc.optional.contains(M::TIMEOUT));
    }
}
