//! `agent-sandbox pending`: the approval queue (the names the agent was refused since the last
//! approval or dismissal), shown, which makes it what `allow --pending` may approve; or
//! dismissed (`approve`).

use crate::approve;
use crate::engine::Engine;
use crate::exit::Result;
use crate::flags::PendingFlags;
use crate::queue;

pub async fn run(flags: &PendingFlags) -> Result<i32> {
    let sandbox = Engine::connect().await?.find(&flags.which.sandbox).await?;
    let _held = approve::hold(&sandbox).await?;
    if flags.dismiss {
        let dismissed = approve::dismiss(&sandbox).await?;
        eprintln!("agent-sandbox: dismissed {dismissed} names");
        return Ok(0);
    }
    let queue = approve::pending(&sandbox).await?;
    if flags.json {
        let all: Vec<&queue::Pending> =
            queue.names.iter().chain(&queue.budgets).chain(&queue.addresses).collect();
        crate::say::json(&all);
    } else {
        print_queue(&queue, &sandbox.name);
    }
    if !queue.unallowable.is_empty() {
        crate::say::line(&format!(
            "agent-sandbox: also refused, and not domains a policy can hold: {}",
            queue.unallowable.join(", ")
        ));
    }
    Ok(0)
}

fn print_queue(queue: &queue::Queue, sandbox: &str) {
    if queue.names.is_empty() && queue.budgets.is_empty() && queue.addresses.is_empty() {
        eprintln!("agent-sandbox: nothing pending in {sandbox}");
    }
    if !queue.names.is_empty() {
        crate::say::out(&queue::render_pending(&queue.names));
        eprintln!(
            "agent-sandbox: allow these with `agent-sandbox allow {sandbox} --pending` (names refused \
             after this look wait for the next), or some with `agent-sandbox allow {sandbox} NAME…`; \
             `--dismiss` empties the queue"
        );
    }
    if !queue.addresses.is_empty() {
        crate::say::out(&queue::render_addresses(&queue.addresses));
    }
    if !queue.budgets.is_empty() {
        crate::say::out(&queue::render_budgets(&queue.budgets));
        eprintln!(
            "agent-sandbox: connections to these are refused or cut until their hour ends; \
             `agent-sandbox allow {sandbox} NAME --upload SIZE` raises a budget"
        );
    }
}
