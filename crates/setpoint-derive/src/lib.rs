//! `#[derive(CustomResource)]`: write the spec of a custom resource as a Rust struct, get the
//! resource type (usable with `setpoint_runtime::Api`, informers and controllers) and its
//! CustomResourceDefinition, with the schema generated from the structs.
//!
//! ```ignore
//! use schemars::JsonSchema;
//! use serde::{Deserialize, Serialize};
//! use setpoint_runtime::CustomResource;
//!
//! #[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
//! #[resource(group = "example.com", version = "v1", kind = "CronBackup", namespaced)]
//! #[resource(status = "CronBackupStatus", shortname = "cb", category = "all")]
//! #[resource(printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".spec.schedule"}"#)]
//! pub struct CronBackupSpec {
//!     pub schedule: String,
//!     pub database: String,
//! }
//!
//! #[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
//! pub struct CronBackupStatus {
//!     pub message: Option<String>,
//! }
//!
//! let backup = CronBackup::new("nightly", CronBackupSpec { schedule: "0 2 * * *".into(), database: "orders".into() });
//! let crd = CronBackup::crd(); // a k8s-openapi CustomResourceDefinition, ready to apply
//! ```
//!
//! The attribute keys are those of kube-rs's `#[kube(...)]` (group, version, kind, plural,
//! namespaced, status, shortname, category, printcolumn, scale, derive), so a kube-rs type
//! moves over by renaming the attribute. The generated struct is named by `kind`, with
//! `metadata`, `spec` and (with `status`) an optional `status`; it implements k8s-openapi's
//! `Resource` and `Metadata` traits, which is all Setpoint's runtime asks of a type.

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::quote;
use syn::{parse_macro_input, DeriveInput, Ident, LitStr};

#[derive(Default)]
struct Args {
    group: Option<String>,
    version: Option<String>,
    kind: Option<String>,
    plural: Option<String>,
    singular: Option<String>,
    namespaced: bool,
    status: Option<String>,
    shortnames: Vec<String>,
    categories: Vec<String>,
    printcolumns: Vec<String>,
    scale: Option<String>,
    derives: Vec<String>,
}

fn parse_args(input: &DeriveInput) -> syn::Result<Args> {
    let mut args = Args::default();
    for attr in input
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("resource") || a.path().is_ident("kube"))
    {
        attr.parse_nested_meta(|meta| {
            let key = meta
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            if key == "namespaced" {
                args.namespaced = true;
                return Ok(());
            }
            let value: LitStr = meta.value()?.parse()?;
            let v = value.value();
            match key.as_str() {
                "group" => args.group = Some(v),
                "version" => args.version = Some(v),
                "kind" => args.kind = Some(v),
                "plural" => args.plural = Some(v),
                "singular" => args.singular = Some(v),
                "status" => args.status = Some(v),
                "shortname" => args.shortnames.push(v),
                "category" => args.categories.push(v),
                "printcolumn" => args.printcolumns.push(v),
                "scale" => args.scale = Some(v),
                "derive" => args.derives.push(v),
                other => {
                    return Err(meta.error(format!("unknown resource attribute `{other}`")));
                }
            }
            Ok(())
        })?;
    }
    Ok(args)
}

/// Derives a custom resource type from its spec struct. See the crate docs.
#[proc_macro_derive(CustomResource, attributes(resource, kube))]
pub fn derive_custom_resource(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let args = parse_args(input)?;
    let missing = |what: &str| {
        syn::Error::new_spanned(
            &input.ident,
            format!("#[resource({what} = \"...\")] is required"),
        )
    };
    let group = args.group.clone().ok_or_else(|| missing("group"))?;
    let version = args.version.clone().ok_or_else(|| missing("version"))?;
    let kind = args.kind.clone().ok_or_else(|| missing("kind"))?;
    let plural = args
        .plural
        .clone()
        .unwrap_or_else(|| format!("{}s", kind.to_lowercase()));
    let singular = args.singular.clone().unwrap_or_else(|| kind.to_lowercase());
    let api_version = if group.is_empty() {
        version.clone()
    } else {
        format!("{group}/{version}")
    };
    let vis = &input.vis;
    let spec = &input.ident;
    let name = Ident::new(&kind, Span::call_site());
    let rt = quote!(::setpoint_runtime::customresource);
    let scope = if args.namespaced {
        quote!(#rt::__private::k8s_openapi::NamespaceResourceScope)
    } else {
        quote!(#rt::__private::k8s_openapi::ClusterResourceScope)
    };
    let derives: Vec<syn::Path> = args
        .derives
        .iter()
        .map(|d| syn::parse_str(d))
        .collect::<syn::Result<_>>()?;
    let (status_field, status_ser, status_new, status_schema) = match &args.status {
        Some(s) => {
            let ty: syn::Type = syn::parse_str(s)?;
            (
                quote! {
                    /// What the controller observed.
                    pub status: ::std::option::Option<#ty>,
                },
                quote! {
                    if let ::std::option::Option::Some(status) = &self.status {
                        map.serialize_entry("status", status)?;
                    }
                },
                quote!(status: ::std::option::Option::None,),
                quote!(::std::option::Option::Some(#rt::schema_of::<#ty>())),
            )
        }
        None => (
            quote!(),
            quote!(),
            quote!(),
            quote!(::std::option::Option::None),
        ),
    };
    let status_de_field = match &args.status {
        Some(s) => {
            let ty: syn::Type = syn::parse_str(s)?;
            quote! {
                #[serde(default)]
                status: ::std::option::Option<#ty>,
            }
        }
        None => quote!(),
    };
    let status_de_move = if args.status.is_some() {
        quote!(status: raw.status,)
    } else {
        quote!()
    };
    let shortnames = &args.shortnames;
    let categories = &args.categories;
    let printcolumns = &args.printcolumns;
    let scale = match &args.scale {
        Some(s) => quote!(::std::option::Option::Some(#s)),
        None => quote!(::std::option::Option::None),
    };
    let doc = format!("The `{api_version}` `{kind}` custom resource (generated from [`{spec}`]).");
    let has_status = args.status.is_some();
    let scope_bool = args.namespaced;
    Ok(quote! {
        #[doc = #doc]
        #[derive(Clone, Debug #(, #derives)*)]
        #vis struct #name {
            /// Standard object metadata.
            pub metadata: #rt::__private::ObjectMeta,
            /// What the user wants.
            pub spec: #spec,
            #status_field
        }

        impl #name {
            /// A new object named `name` with `spec` (and no status).
            pub fn new(name: &str, spec: #spec) -> Self {
                #name {
                    metadata: #rt::__private::ObjectMeta {
                        name: ::std::option::Option::Some(name.to_string()),
                        ..::std::default::Default::default()
                    },
                    spec,
                    #status_new
                }
            }

            /// The CustomResourceDefinition of this resource, with the schema generated from
            /// the spec (and status) types.
            pub fn crd() -> #rt::__private::CustomResourceDefinition {
                #rt::definition(&#rt::Definition {
                    group: #group,
                    version: #version,
                    kind: #kind,
                    plural: #plural,
                    singular: #singular,
                    namespaced: #scope_bool,
                    short_names: &[#(#shortnames),*],
                    categories: &[#(#categories),*],
                    printer_columns: &[#(#printcolumns),*],
                    status: #has_status,
                    scale: #scale,
                    spec_schema: #rt::schema_of::<#spec>(),
                    status_schema: #status_schema,
                })
            }
        }

        impl #rt::__private::k8s_openapi::Resource for #name {
            const API_VERSION: &'static str = #api_version;
            const GROUP: &'static str = #group;
            const KIND: &'static str = #kind;
            const VERSION: &'static str = #version;
            const URL_PATH_SEGMENT: &'static str = #plural;
            type Scope = #scope;
        }

        impl #rt::__private::k8s_openapi::Metadata for #name {
            type Ty = #rt::__private::ObjectMeta;
            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }

        impl #rt::__private::serde::Serialize for #name {
            fn serialize<S: #rt::__private::serde::Serializer>(
                &self,
                serializer: S,
            ) -> ::std::result::Result<S::Ok, S::Error> {
                use #rt::__private::serde::ser::SerializeMap;
                let mut map = serializer.serialize_map(::std::option::Option::None)?;
                map.serialize_entry("apiVersion", #api_version)?;
                map.serialize_entry("kind", #kind)?;
                map.serialize_entry("metadata", &self.metadata)?;
                map.serialize_entry("spec", &self.spec)?;
                #status_ser
                map.end()
            }
        }

        impl<'de> #rt::__private::serde::Deserialize<'de> for #name {
            fn deserialize<D: #rt::__private::serde::Deserializer<'de>>(
                deserializer: D,
            ) -> ::std::result::Result<Self, D::Error> {
                #[derive(#rt::__private::serde::Deserialize)]
                #[serde(crate = "::setpoint_runtime::customresource::__private::serde")]
                struct Raw {
                    #[serde(default)]
                    metadata: #rt::__private::ObjectMeta,
                    spec: #spec,
                    #status_de_field
                }
                let raw = Raw::deserialize(deserializer)?;
                ::std::result::Result::Ok(#name {
                    metadata: raw.metadata,
                    spec: raw.spec,
                    #status_de_move
                })
            }
        }
    })
}
