//! Choosing the next token from a row of logits: the repetition penalty, then greedy choice or
//! a draw after temperature, top-k and top-p (the order transformers applies them in), from a
//! small seeded generator so that a seed always gives the same text.

use super::Sampling;

/// xoshiro256** seeded through splitmix64: fast, small, and the same stream on every platform.
#[derive(Clone, Debug)]
pub(crate) struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// Stream `stream` of `seed`: one per sequence of a batch, so that its sequences draw
    /// differently even from the same prompt.
    pub(crate) fn new(seed: u64, stream: u64) -> Rng {
        let mut mix = seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03);
        let mut next = || {
            mix = mix.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = mix;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng { state: [next(), next(), next(), next()] }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform value in `[0, 1)` with 53 random bits.
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Divides the logit of every token in `seen` by `penalty` when positive and multiplies it when
/// negative, once per distinct token (transformers' repetition penalty).
pub(crate) fn penalize(logits: &mut [f32], seen: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut done = vec![false; logits.len()];
    for &id in seen {
        let id = id as usize;
        if id < logits.len() && !done[id] {
            done[id] = true;
            let logit = &mut logits[id];
            *logit = if *logit < 0.0 { *logit * penalty } else { *logit / penalty };
        }
    }
}

/// The index of the largest logit (the first on ties).
pub(crate) fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (index, &logit) in logits.iter().enumerate() {
        if logit > logits[best] {
            best = index;
        }
    }
    best
}

/// The next token for one row of `logits` (already penalised).
pub(crate) fn choose(logits: &[f32], sampling: &Sampling, rng: &mut Rng) -> u32 {
    let Sampling::Random { temperature, top_k, top_p, min_p } = *sampling else {
        return argmax(logits) as u32;
    };
    if temperature == 0.0 {
        return argmax(logits) as u32;
    }
    // Candidates by decreasing logit (ties by id, so that the order never depends on the sort).
    let mut order: Vec<usize> = (0..logits.len()).filter(|&id| !logits[id].is_nan()).collect();
    order.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if let Some(k) = top_k
        && k < order.len()
    {
        // Tokens tied with the k-th are kept, as transformers keeps them.
        let threshold = logits[order[k - 1]];
        let kept = order.iter().take_while(|&&id| logits[id] >= threshold).count();
        order.truncate(kept);
    }
    let Some(&best) = order.first() else { return 0 };
    if let Some(p) = min_p
        && p > 0.0
    {
        // `p_i >= p * p_best` of the softmax before the temperature: `l_i - l_best >= ln p`.
        let floor = f64::from(logits[best]) + f64::from(p).ln();
        let kept = order.iter().take_while(|&&id| f64::from(logits[id]) >= floor).count().max(1);
        order.truncate(kept);
    }
    let scaled = |id: usize| (f64::from(logits[id]) - f64::from(logits[best])) / f64::from(temperature);
    let mut weights: Vec<f64> = order.iter().map(|&id| scaled(id).exp()).collect();
    if let Some(p) = top_p
        && p < 1.0
    {
        // The smallest set of most likely tokens whose probability reaches `p` (at least one).
        let total: f64 = weights.iter().sum();
        let mut before = 0.0;
        let kept = weights
            .iter()
            .take_while(|&&weight| {
                let keep = before < f64::from(p) * total;
                before += weight;
                keep
            })
            .count()
            .max(1);
        weights.truncate(kept);
    }
    let total: f64 = weights.iter().sum();
    let mut target = rng.uniform() * total;
    for (&id, &weight) in order.iter().zip(&weights) {
        if target < weight {
            return id as u32;
        }
        target -= weight;
    }
    order[weights.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_reproducible_and_uniform() {
        let mut a = Rng::new(7, 0);
        let mut b = Rng::new(7, 0);
        let draws: Vec<f64> = (0..1000).map(|_| a.uniform()).collect();
        assert!(draws.iter().all(|&u| u == b.uniform() && (0.0..1.0).contains(&u)));
        let mean = draws.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
        assert_ne!(Rng::new(7, 1).uniform(), Rng::new(7, 0).uniform());
        assert_ne!(Rng::new(8, 0).uniform(), Rng::new(7, 0).uniform());
    }

    #[test]
    fn penalty_follows_the_sign_once_per_token() {
        let mut logits = [2.0f32, -2.0, 1.0];
        penalize(&mut logits, &[0, 1, 0, 1], 2.0);
        assert_eq!(logits, [1.0, -4.0, 1.0]);
    }

    #[test]
    fn top_k_and_top_p_limit_the_draws() {
        let logits = [0.0f32, 3.0, 2.9, -1.0, 2.8];
        let mut rng = Rng::new(1, 0);
        let sampling = |top_k, top_p| Sampling::Random { temperature: 1.0, top_k, top_p, min_p: None };
        let draws = |sampling: Sampling, rng: &mut Rng| {
            let mut seen = [0usize; 5];
            for _ in 0..2000 {
                seen[choose(&logits, &sampling, rng) as usize] += 1;
            }
            seen
        };
        assert_eq!(draws(sampling(Some(1), None), &mut rng), [0, 2000, 0, 0, 0]);
        let seen = draws(sampling(Some(2), None), &mut rng);
        assert!(seen[1] > 0 && seen[2] > 0 && seen[0] + seen[3] + seen[4] == 0, "{seen:?}");
        // Token 1 alone holds about 36% of the probability: p = 0.3 keeps it alone, p = 0.5
        // adds the next.
        assert_eq!(draws(sampling(None, Some(0.3)), &mut rng), [0, 2000, 0, 0, 0]);
        let seen = draws(sampling(None, Some(0.5)), &mut rng);
        assert!(seen[1] > 0 && seen[2] > 0 && seen[4] == 0, "{seen:?}");
        let seen = draws(sampling(None, None), &mut rng);
        assert!(seen.iter().all(|&count| count > 0), "{seen:?}");
        // A low temperature sharpens towards the argmax.
        let cold = draws(Sampling::Random { temperature: 0.01, top_k: None, top_p: None, min_p: None }, &mut rng);
        assert_eq!(cold[1], 2000);
        assert_eq!(choose(&logits, &Sampling::Greedy, &mut rng), 1);
    }

    #[test]
    fn min_p_keeps_the_tokens_near_the_most_likely_one() {
        // Relative to token 1 (logit 3): token 2 is e^-0.1 = 0.90 as likely, token 4 e^-0.2 =
        // 0.82, token 0 e^-3 = 0.05, token 3 e^-4 = 0.02.
        let logits = [0.0f32, 3.0, 2.9, -1.0, 2.8];
        let mut rng = Rng::new(3, 0);
        let draws = |min_p: f32, temperature: f32, rng: &mut Rng| {
            let sampling = Sampling::Random { temperature, top_k: None, top_p: None, min_p: Some(min_p) };
            let mut seen = [0usize; 5];
            for _ in 0..2000 {
                seen[choose(&logits, &sampling, rng) as usize] += 1;
            }
            seen
        };
        let seen = draws(0.85, 1.0, &mut rng);
        assert!(seen[1] > 0 && seen[2] > 0 && seen[0] + seen[3] + seen[4] == 0, "{seen:?}");
        let seen = draws(0.5, 1.0, &mut rng);
        assert!(seen[1] > 0 && seen[2] > 0 && seen[4] > 0 && seen[0] + seen[3] == 0, "{seen:?}");
        // The filter is on the probabilities before the temperature: a hot draw keeps the same set.
        let seen = draws(0.5, 100.0, &mut rng);
        assert!(seen[0] + seen[3] == 0, "{seen:?}");
        assert_eq!(draws(1.0, 1.0, &mut rng), [0, 2000, 0, 0, 0]);
    }
}
