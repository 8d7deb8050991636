//! What rdma-core's `cmtime` and ours exchange over TCP to keep client and server in step.
//!
//! The client sends the number of a step as one byte at three points of every round: when it
//! starts ([`Step::FullConnect`], 0), once all its connections are established
//! ([`Step::CmConnect`], 12) and once all are disconnected ([`Step::Disconnect`], 14). The
//! server sends the same byte back when its own side of the step is done. Any other byte is
//! a peer that is not cmtime, or one run with other flags: [`check_announced`] and
//! [`check_answer`] say so.

use std::fmt;

/// The steps timed, in the order of the table. The numbers of `FullConnect` (a round
/// starts), `CmConnect` (all connected) and `Disconnect` (all disconnected) are the bytes the
/// client sends to keep the sides in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Step {
    FullConnect = 0,
    CreateId,
    BindAddr,
    ResolveAddr,
    ResolveRoute,
    CreateQp,
    InitQpAttr,
    InitQp,
    RtrQpAttr,
    RtrQp,
    RtsQpAttr,
    RtsQp,
    CmConnect,
    Establish,
    Disconnect,
    DestroyId,
    DestroyQp,
}

/// Every step with the name its table row has, in table order (a step's number is its index).
pub const STEPS: [(Step, &str); 17] = [
    (Step::FullConnect, "full connect"),
    (Step::CreateId, "create id"),
    (Step::BindAddr, "bind addr"),
    (Step::ResolveAddr, "resolve addr"),
    (Step::ResolveRoute, "resolve route"),
    (Step::CreateQp, "create qp"),
    (Step::InitQpAttr, "init qp attr"),
    (Step::InitQp, "init qp"),
    (Step::RtrQpAttr, "rtr qp attr"),
    (Step::RtrQp, "rtr qp"),
    (Step::RtsQpAttr, "rts qp attr"),
    (Step::RtsQp, "rts qp"),
    (Step::CmConnect, "cm connect"),
    (Step::Establish, "establish"),
    (Step::Disconnect, "disconnect"),
    (Step::DestroyId, "destroy id"),
    (Step::DestroyQp, "destroy qp"),
];

/// The steps whose numbers go on the wire, in the order a round sends them.
pub const SYNC_STEPS: [Step; 3] = [Step::FullConnect, Step::CmConnect, Step::Disconnect];

impl Step {
    /// The byte that stands for the step on the wire: its number.
    pub fn byte(self) -> u8 {
        self as u8
    }

    /// The step's name in the table.
    pub fn name(self) -> &'static str {
        STEPS[self as usize].1
    }
}

/// A byte from the peer that is not the step the protocol is at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepMismatch {
    /// The client announced another step than the server expected.
    Announced {
        /// The byte that came.
        got: u8,
        /// The step that belongs there.
        expected: Step,
    },
    /// The server answered a step with another byte.
    Answered {
        /// The step the client announced.
        sent: Step,
        /// The byte that came back.
        got: u8,
    },
}

impl fmt::Display for StepMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            StepMismatch::Announced { got, expected } => write!(
                f,
                "the client announced step {got} where step {} ({}) belongs: is it a cmtime \
                 client with the same -c?",
                expected.byte(),
                expected.name()
            ),
            StepMismatch::Answered { sent, got } => write!(
                f,
                "the server answered step {} ({}) with {got}: is it a cmtime server?",
                sent.byte(),
                sent.name()
            ),
        }
    }
}

impl std::error::Error for StepMismatch {}

/// Server: checks the byte the client sent where `expected` belongs.
pub fn check_announced(got: u8, expected: Step) -> Result<(), StepMismatch> {
    if got == expected.byte() {
        Ok(())
    } else {
        Err(StepMismatch::Announced { got, expected })
    }
}

/// Client: checks the server's answer `got` to the announced step `sent`.
pub fn check_answer(sent: Step, got: u8) -> Result<(), StepMismatch> {
    if got == sent.byte() {
        Ok(())
    } else {
        Err(StepMismatch::Answered { sent, got })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_numbers_are_rdma_cores() {
        // rdma-core's cmtime sends these numbers: its enum's order.
        assert_eq!(
            SYNC_STEPS.map(Step::byte),
            [0, 12, 14],
            "the bytes on the wire"
        );
        for (i, (step, _)) in STEPS.iter().enumerate() {
            assert_eq!(usize::from(step.byte()), i);
        }
    }
}
