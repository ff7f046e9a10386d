//! Registers `diffgemma-lsp` (found on PATH) as a language server, so its multi-line completions appear in
//! Zed's completion menu. Settings under `lsp."diffgemma-lsp".initialization_options` reach the server.

use zed_extension_api::{self as zed, settings::LspSettings, LanguageServerId, Result};

struct Diffgemma;

impl zed::Extension for Diffgemma {
    fn new() -> Self {
        Diffgemma
    }

    fn language_server_command(
        &mut self,
        _language_server_id: &LanguageServerId,
        worktree: &zed::Worktree,
    ) -> Result<zed::Command> {
        let command = worktree.which("diffgemma-lsp").ok_or_else(|| {
            "diffgemma-lsp is not on PATH: install it first (editors/zed/README.md, step 1)".to_string()
        })?;
        Ok(zed::Command {
            command,
            args: vec!["--stdio".to_string()],
            env: worktree.shell_env(),
        })
    }

    fn language_server_initialization_options(
        &mut self,
        language_server_id: &LanguageServerId,
        worktree: &zed::Worktree,
    ) -> Result<Option<zed::serde_json::Value>> {
        Ok(LspSettings::for_worktree(language_server_id.as_ref(), worktree)
            .ok()
            .and_then(|settings| settings.initialization_options))
    }
}

zed::register_extension!(Diffgemma);
