//! The contract every image keeps (the harness's `contract`), generated from images/
//! (tests/build.rs): add an image folder and `contract::<image>::…` appear. The one under
//! `net_admin::` needs NET_ADMIN.

use sandbox_tests::contract::{self, Subject};

macro_rules! contract_tests {
    ($name:literal) => {
        #[tokio::test]
        async fn labels_and_lock_entry() -> anyhow::Result<()> {
            super::contract::labels_and_lock_entry(&super::Subject::of_repository($name).await?).await
        }

        #[tokio::test]
        async fn starts_ready_with_an_unprivileged_agent() -> anyhow::Result<()> {
            super::contract::starts_ready_with_an_unprivileged_agent(
                &super::Subject::of_repository($name).await?,
            )
            .await
        }

        #[tokio::test]
        async fn agent_command_answers_version_offline() -> anyhow::Result<()> {
            super::contract::agent_command_answers_version_offline(
                &super::Subject::of_repository($name).await?,
            )
            .await
        }

        #[tokio::test]
        async fn no_large_file_is_stored_twice() -> anyhow::Result<()> {
            super::contract::no_large_file_is_stored_twice(&super::Subject::of_repository($name).await?).await
        }

        #[tokio::test]
        async fn unattended_mode_is_declared_and_applied() -> anyhow::Result<()> {
            super::contract::unattended_mode_is_declared_and_applied(
                &super::Subject::of_repository($name).await?,
            )
            .await
        }

        #[tokio::test]
        async fn state_dirs_are_the_agents_and_outlive_the_container() -> anyhow::Result<()> {
            super::contract::state_dirs_are_the_agents_and_outlive_the_container(
                &super::Subject::of_repository($name).await?,
            )
            .await
        }

        #[tokio::test]
        async fn its_sign_in_hosts_are_in_its_policy() -> anyhow::Result<()> {
            super::contract::its_sign_in_hosts_are_in_its_policy(&super::Subject::of_repository($name).await?)
                .await
        }

        // `contract::<image>::net_admin::single::…`: its own policy, on a test network.
        net_admin! {
            [single] {
                #[tokio::test]
                async fn reaches_its_policy_and_not_example_com() -> anyhow::Result<()> {
                    let subject = sandbox_tests::contract::Subject::of_repository($name).await?;
                    sandbox_tests::contract::reaches_its_policy_and_not_example_com(&subject).await
                }
            }
        }
    };
}

include!(concat!(env!("OUT_DIR"), "/contract_images.rs"));
