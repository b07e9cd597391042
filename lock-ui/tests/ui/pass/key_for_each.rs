// Keys from a collection: `TEMPLATE for PAT in EXPR`, alone or in a list. EXPR
// is borrowed (the keys iterate `&(EXPR)`, like `for sku in &skus`), so the
// body still has it; the template may use the pattern's bindings besides the
// parameters, and a binding shadows a parameter of the same name.
use std::collections::{BTreeMap, HashSet};

use distlock::{distributed_lock, LockError, LockManager, MultiLockGuard};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

pub struct Line {
    pub sku: String,
    pub qty: u32,
}

#[distributed_lock(key = "sku:{sku}" for sku in skus)]
async fn reserve(skus: Vec<String>) -> Result<usize, AppError> {
    // Still ours: the keys only borrowed it.
    Ok(skus.len())
}

#[distributed_lock(key = ["order:{id}", "sku:{sku}" for sku in skus], lease = "30s", guard = g)]
async fn order(id: u64, skus: Vec<String>) -> Result<Vec<String>, AppError> {
    let _: &MultiLockGuard = g;
    let _ = id;
    Ok(skus)
}

// Patterns: fields of the items, tuples (from a map), references; a slice
// parameter is dereferenced (`&(*lines)` iterates, `&(lines)` would not).
#[distributed_lock(key = [
    "warehouse:{warehouse}",
    "sku:{line.sku}" for line in *lines,
    "bin:{bin}:{slot}" for (bin, slot) in bins,
    "id:{id}" for &id in ids,
])]
async fn pick(
    warehouse: u32,
    lines: &[Line],
    bins: BTreeMap<u32, String>,
    ids: [u64; 3],
) -> Result<u32, AppError> {
    let _ = (warehouse, bins, ids);
    Ok(lines.iter().map(|l| l.qty).sum())
}

pub struct Cart {
    items: HashSet<u64>,
    user: u64,
}

impl Cart {
    // `self` in the collection and in the template; a binding named like a
    // parameter (`user`) is the binding.
    #[distributed_lock(
        key = ["cart:{self.user}", "item:{user}:{item}" for item in self.items, "user:{user}" for user in users],
        manager = manager
    )]
    async fn checkout(
        &self,
        manager: &LockManager,
        user: u64,
        users: Vec<u64>,
    ) -> Result<u64, AppError> {
        let _ = users;
        Ok(user + self.items.len() as u64)
    }
}

fn assert_send<T: Send>(_: T) {}

fn exercise(manager: LockManager) {
    assert_send(reserve(vec!["a".to_owned()]));
    assert_send(order(1, Vec::new()));
    let lines = [Line {
        sku: "a".to_owned(),
        qty: 1,
    }];
    assert_send(pick(1, &lines, BTreeMap::new(), [1, 2, 3]));
    let cart = Cart {
        items: HashSet::new(),
        user: 7,
    };
    assert_send(cart.checkout(&manager, 7, vec![8]));
}

fn main() {
    let _: fn(LockManager) = exercise;
}
