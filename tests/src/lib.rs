//! Shared helpers of allocsim's corpus tests: where the real traces are and what their
//! `.stats.json` files say.
