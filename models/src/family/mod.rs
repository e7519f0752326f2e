//! Model families, one module each: everything that differs between BERT and GPT-2 lives in
//! its family's module, so that a new family is one new module.

pub mod bert;
pub mod gpt2;
