//! The second axis of a model beside its family: its head. An [`Architecture`] (HF's
//! `…For…` class, `config.architectures[0]`) is a family with one of the heads that family
//! lists ([`FamilyInfo::heads`]).

use std::fmt;

use super::{FamilyInfo, FAMILIES};

/// The heads ortbench trains, one per `--task` (HF's `AutoModelFor…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// Vocabulary logits at every position; the loss reads the masked positions' labels.
    MaskedLm,
    /// Vocabulary logits at every position; labels are the ids, shifted by one for the loss.
    CausalLm,
    /// `num_labels` logits from one pooled token per row.
    SequenceClassification,
    /// `num_labels` logits at every position.
    TokenClassification,
}

/// The `--task` names, in [`Head::ALL`] order.
pub const TASKS: &[&str] =
    &["masked-lm", "causal-lm", "sequence-classification", "token-classification"];

impl Head {
    /// Every head, in [`TASKS`] order.
    pub const ALL: [Head; 4] =
        [Head::MaskedLm, Head::CausalLm, Head::SequenceClassification, Head::TokenClassification];

    /// The `--task` that asks for this head (and the task name results record for it).
    pub fn task_name(self) -> &'static str {
        TASKS[self as usize]
    }

    /// The head `--task name` asks for.
    pub fn for_task(name: &str) -> Option<Head> {
        Head::ALL.into_iter().find(|h| h.task_name() == name)
    }
}

/// A family with one of its heads: what a config.json's `architectures` names. Made only for a
/// head the family lists, so that every method below has an answer.
#[derive(Clone, Copy)]
pub struct Architecture {
    family: &'static FamilyInfo,
    head: Head,
}

impl Architecture {
    pub fn family(self) -> &'static FamilyInfo {
        self.family
    }

    pub fn head(self) -> Head {
        self.head
    }

    /// `family` with `head`, if the family builds that head.
    pub fn new(family: &'static FamilyInfo, head: Head) -> Option<Self> {
        family.heads.iter().any(|(h, _)| *h == head).then_some(Architecture { family, head })
    }

    /// The architecture of `family` for `task` (`--task`): what HF's AutoModelFor… builds.
    pub fn for_task(family: &'static FamilyInfo, task: &str) -> Option<Self> {
        Architecture::new(family, Head::for_task(task)?)
    }

    /// HF's default class of `family` (a config.json with a `model_type` but no
    /// `architectures`): its first head.
    pub fn default_of(family: &'static FamilyInfo) -> Self {
        Architecture { family, head: family.heads[0].0 }
    }

    /// The architecture of HF's class `name`, among every family's heads.
    pub fn from_hf_name(name: &str) -> Option<Self> {
        FAMILIES.iter().find_map(|&family| {
            let (head, _) = family.heads.iter().find(|(_, n)| *n == name)?;
            Some(Architecture { family, head: *head })
        })
    }

    /// Every supported HF class name, family by family, for messages.
    pub fn supported() -> Vec<&'static str> {
        FAMILIES.iter().flat_map(|f| f.heads.iter().map(|(_, n)| *n)).collect()
    }

    /// HF's class name (`BertForMaskedLM`, `GPT2LMHeadModel`, …).
    pub fn hf_name(self) -> &'static str {
        self.family
            .heads
            .iter()
            .find(|(h, _)| *h == self.head)
            .map(|(_, n)| *n)
            .expect("an Architecture is only made for a head its family lists")
    }

    /// A sequence classifier (one label, or `num_labels` targets, per row).
    pub fn is_classifier(self) -> bool {
        self.head == Head::SequenceClassification
    }
}

impl PartialEq for Architecture {
    fn eq(&self, other: &Self) -> bool {
        self.family.model_type == other.family.model_type && self.head == other.head
    }
}

impl Eq for Architecture {}

impl fmt::Debug for Architecture {
    /// HF's class name: the family's static table is not worth printing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hf_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_round_trip_through_task_and_hf_names() {
        for head in Head::ALL {
            assert_eq!(Head::for_task(head.task_name()), Some(head));
        }
        for name in Architecture::supported() {
            assert_eq!(Architecture::from_hf_name(name).unwrap().hf_name(), name);
        }
        assert!(Architecture::from_hf_name("FalconForCausalLM").is_none());
    }
}
