//! The platforms the project's binaries are built for: the engine's `os/arch` name, Rust's
//! target triple, Debian's architecture, and the cross linker a build for a platform other
//! than the host's needs (Debian's `gcc-aarch64-linux-gnu`, `gcc-x86-64-linux-gnu`).
//!
//! The build keeps one chain of images per platform: sandbox-init cross-built, the OS layer
//! bootstrapped for the platform's Debian architecture, every image built on it under emulation
//! (qemu-user through binfmt_misc) where the host is another, tagged with the platform's
//! [`Platform::tag`], its input hash in images.lock under [`Platform::name`].

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Platform {
    Amd64,
    Arm64,
}

impl Platform {
    pub const ALL: [Platform; 2] = [Platform::Amd64, Platform::Arm64];

    /// The platform this program was built for, which is the machine's.
    pub fn host() -> Platform {
        if cfg!(target_arch = "aarch64") { Platform::Arm64 } else { Platform::Amd64 }
    }

    /// The engine's and OCI's name: `linux/amd64`, `linux/arm64`.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Amd64 => "linux/amd64",
            Platform::Arm64 => "linux/arm64",
        }
    }

    /// The OCI variant the engine records (`v8` for arm64), if any.
    pub fn variant(self) -> Option<&'static str> {
        match self {
            Platform::Amd64 => None,
            Platform::Arm64 => Some("v8"),
        }
    }

    /// The tag an image of this platform gets for `version`: the version itself on the host's
    /// platform (what the launcher runs), `<version>-arm64` on another, since one engine holds
    /// one image per tag.
    pub fn tag(self, version: &str) -> String {
        if self == Platform::host() {
            version.to_string()
        } else {
            format!("{version}-{}", self.debian_arch())
        }
    }

    /// Rust's target triple (glibc, linked static with crt-static).
    pub fn triple(self) -> &'static str {
        match self {
            Platform::Amd64 => "x86_64-unknown-linux-gnu",
            Platform::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// Debian's architecture, as mmdebstrap and dpkg name it.
    pub fn debian_arch(self) -> &'static str {
        match self {
            Platform::Amd64 => "amd64",
            Platform::Arm64 => "arm64",
        }
    }

    /// The C linker cargo needs for this platform from `from`: none for the same platform, else
    /// Debian's cross gcc; and the variable that names it to cargo.
    pub fn cross_linker(self, from: Platform) -> Option<(String, &'static str)> {
        let var = format!("CARGO_TARGET_{}_LINKER", self.triple().to_ascii_uppercase().replace('-', "_"));
        let linker = match self {
            Platform::Amd64 => "x86_64-linux-gnu-gcc",
            Platform::Arm64 => "aarch64-linux-gnu-gcc",
        };
        (self != from).then_some((var, linker))
    }

    /// The Debian package that has [`Platform::cross_linker`]'s linker.
    pub fn cross_package(self) -> &'static str {
        match self {
            Platform::Amd64 => "gcc-x86-64-linux-gnu",
            Platform::Arm64 => "gcc-aarch64-linux-gnu",
        }
    }
}

impl Default for Platform {
    fn default() -> Platform {
        Platform::host()
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Platform {
    type Err = String;

    fn from_str(text: &str) -> Result<Platform, String> {
        match text.trim() {
            "linux/amd64" | "amd64" => Ok(Platform::Amd64),
            "linux/arm64" | "linux/arm64/v8" | "arm64" => Ok(Platform::Arm64),
            other => {
                Err(format!("`{other}` is not a platform this project builds (linux/amd64, linux/arm64)"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms_read_as_the_engine_writes_them() {
        assert_eq!("linux/arm64".parse(), Ok(Platform::Arm64));
        assert_eq!("linux/arm64/v8".parse(), Ok(Platform::Arm64));
        assert_eq!(" linux/amd64".parse(), Ok(Platform::Amd64));
        assert!("linux/riscv64".parse::<Platform>().unwrap_err().contains("linux/amd64, linux/arm64"));
        for platform in Platform::ALL {
            assert_eq!(platform.name().parse(), Ok(platform));
        }
    }

    #[test]
    fn the_hosts_platform_has_the_plain_tag() {
        let other = if Platform::host() == Platform::Amd64 { Platform::Arm64 } else { Platform::Amd64 };
        assert_eq!(Platform::host().tag("0.1.0"), "0.1.0");
        assert_eq!(other.tag("0.1.0"), format!("0.1.0-{}", other.debian_arch()));
    }

    #[test]
    fn only_another_platform_needs_a_cross_linker() {
        assert_eq!(Platform::Arm64.cross_linker(Platform::Arm64), None);
        let (var, linker) = Platform::Arm64.cross_linker(Platform::Amd64).unwrap();
        assert_eq!(
            (var.as_str(), linker),
            ("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", "aarch64-linux-gnu-gcc")
        );
        assert_eq!(Platform::Amd64.cross_linker(Platform::Arm64).unwrap().1, "x86_64-linux-gnu-gcc");
    }
}
